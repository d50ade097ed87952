"""The command line: one-line errors with no traceback, non-zero exits, `recipe show`."""

import dataclasses
import json
import subprocess
import sys

import pytest

from draftheads.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "draftheads", *args], capture_output=True, text=True, timeout=300)


def assert_one_line_error(result, expected):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and expected in lines[-1], result.stderr
    assert "Traceback" not in result.stderr


def test_bad_recipe_value_from_a_real_process_has_no_traceback():
    assert_one_line_error(run_cli("recipe", "show", "eagle-smollm2", "train.lr=-3", "--no-target"),
                          "train.lr must be positive")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["recipe", "show", "nope"], "unknown recipe 'nope'"),
        (["recipe", "show", "medusa-smollm2", "head.num_heads=0", "--no-target"], "head.num_heads"),
        (["recipe", "show", "medusa-smollm2", "target.name=/does/not/exist"], "does not exist"),
        (["recipe", "show", "medusa-smollm2", "target.name=/tmp/missing-model.gguf"], "GGUF file"),
    ],
)
def test_bad_inputs_exit_2_with_one_line(args, expected, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and expected in err and "\n" not in err


def test_folder_without_config_json(tmp_path, capsys):
    assert main(["recipe", "show", "medusa-smollm2", f"target.name={tmp_path}"]) == 2
    assert "without config.json" in capsys.readouterr().err


def test_unreachable_hub_id_offline(monkeypatch, capsys):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once at import
    assert main(["recipe", "show", "medusa-smollm2", "target.name=no-such-org/no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "could not load 'no-such-org/no-such-model'" in err and "local model folder" in err


def test_recipe_show_derives_sizes_from_the_target(tiny_target_dir, capsys):
    assert main(["recipe", "show", "eagle3-llama3.1-8b", f"target.name={tiny_target_dir}",
                 "head.draft_vocab_size=200"]) == 0
    out = capsys.readouterr().out
    assert "hidden_size: 64" in out and "num_layers: 4" in out and "vocab_size: 384" in out
    assert "feature_layers: [0, 1, 2]" in out  # derived for a 4-layer target


def test_recipe_list_names_every_bundled_recipe(capsys):
    assert main(["recipe", "list"]) == 0
    assert "eagle-smollm2" in capsys.readouterr().out


def test_train_entry_points_reach_the_same_function(monkeypatch):
    import draftheads.cli
    import draftheads.train

    seen = []
    monkeypatch.setattr("draftheads.training.loop.run_training", lambda recipe, **kw: seen.append(recipe))
    assert draftheads.cli.main(["train", "eagle-smollm2", "train.lr=1e-4"]) == 0
    assert draftheads.train.main(["eagle-smollm2", "train.lr=1e-4"]) == 0
    assert [r.train.lr for r in seen] == [1e-4, 1e-4]


def test_eval_takes_unset_flags_from_the_runs_recipe(tmp_path, monkeypatch):
    import draftheads.evaluation.evaluate as evaluate

    run = tmp_path / "runs" / "tiny"
    (run / "final" / "drafter").mkdir(parents=True)
    (run / "final" / "drafter" / "config.json").write_text("{}")
    (run / "step_000010").mkdir()
    (run / "step_000010" / "recipe.yaml").write_text(
        "eval:\n  limit: 3\n  tree: chain:2\n  accept: [strict]\n  temperatures: [0.7]\n  max_new_tokens: 16\n"
        "  seed: 5\n  batch_sizes: [1, 8]\n  plain_above: 6\n"
    )
    seen = []
    monkeypatch.setattr(evaluate, "run_eval", lambda drafters, config, **kw: seen.append(dataclasses.asdict(config)))

    assert main(["eval", str(run)]) == 0
    assert main(["eval", str(run) + "+lookup", "--limit", "7", "--accept", "greedy,typical", "--temperature", "0"]) == 0
    assert main(["eval", "lookup"]) == 0
    assert main(["eval", str(run), "--batch-size", "1,2,4", "--plain-above", "3"]) == 0
    assert main(["eval", str(run), "--batch-size", "1,16", "--plain-above", "auto"]) == 0

    from_recipe, overridden, defaults, batched, auto = seen
    assert auto["plain_above"] == "auto"
    assert ((from_recipe["batch_sizes"], from_recipe["plain_above"], defaults["batch_sizes"], defaults["plain_above"])
            == ([1, 8], 6, [1], None))
    assert (batched["batch_sizes"], batched["plain_above"]) == ([1, 2, 4], 3)
    assert ((from_recipe["limit"], from_recipe["tree"], from_recipe["accept"], from_recipe["temperatures"])
            == (3, "chain:2", ["strict"], [0.7]))
    assert (from_recipe["max_new_tokens"], from_recipe["seed"], from_recipe["prompts"]) == (16, 5, "humaneval")
    assert ((overridden["limit"], overridden["accept"], overridden["temperatures"], overridden["tree"])
            == (7, ["greedy", "typical"], [0.0], "chain:2"))
    assert ((defaults["limit"], defaults["accept"], defaults["max_new_tokens"], defaults["tree"])
            == (20, ["greedy"], 128, None))


def test_a_preset_replaces_the_recipes_draft_settings_and_refuses_a_conflicting_flag(tmp_path, monkeypatch, capsys):
    import draftheads.evaluation.evaluate as evaluate

    run = tmp_path / "runs" / "tiny"
    (run / "final" / "drafter").mkdir(parents=True)
    (run / "final" / "drafter" / "config.json").write_text("{}")
    (run / "step_000010").mkdir()
    (run / "step_000010" / "recipe.yaml").write_text(
        "eval:\n  limit: 3\n  tree: chain:2\n  accept: [strict]\n  temperatures: [0.7]\n  batch_sizes: [1, 8]\n")
    seen = []
    monkeypatch.setattr(evaluate, "run_eval", lambda drafters, config, **kw: seen.append(dataclasses.asdict(config)))

    assert main(["eval", str(run), "--preset", "specbundle-8", "--prompts", "mt-bench"]) == 0
    assert main(["eval", str(run), "--preset", "eagle", "--tree", "dynamic:10,6,59"]) == 0   # the same tree: fine
    got = seen[0]
    assert (got["preset"], got["tree"], got["accept"], got["temperatures"], got["batch_sizes"], got["limit"],
            got["prompts"]) == ("specbundle-8", "chain:7", ["greedy"], [0.0], [1], 3, "mt-bench")
    assert seen[1]["tree"] == "dynamic:10,6,59"
    capsys.readouterr()
    assert main(["eval", str(run), "--preset", "specbundle-4", "--temperature", "0.7"]) == 2
    err = capsys.readouterr().err.strip()
    assert "fixes eval.temperatures (--temperature) to [0.0], but [0.7] was given" in err and "\n" not in err
    with pytest.raises(SystemExit):   # argparse names the presets
        main(["eval", str(run), "--preset", "specbundle-3"])


def test_engine_eval_is_its_own_command_with_only_its_flags(tmp_path, monkeypatch, capsys):
    import draftheads.evaluation.engine_eval as engine_eval

    run = tmp_path / "runs" / "x"
    (run / "final" / "drafter").mkdir(parents=True)
    (run / "final" / "drafter" / "config.json").write_text("{}")
    seen = []
    monkeypatch.setattr(engine_eval, "run_engine_eval", lambda drafters, config, **kw: seen.append((config, kw)))
    assert main(["engine", "eval", "llama.cpp", str(run), "--draft-tokens", "3,2", "--draft-p-min", "0,0.5",
                 "--no-ngram", "--limit", "4"]) == 0
    ((config, kw),) = seen
    assert ((config.draft_tokens, config.p_mins, config.ngram, config.limit, kw["engine"])
            == ([3, 2], [0.0, 0.5], False, 4, "llama.cpp"))
    assert main(["engine", "eval", "llama.cpp", str(run), "--draft-tokens", "0"]) == 2
    assert "--draft-tokens must be whole numbers >= 1" in capsys.readouterr().err
    assert main(["eval", str(run), "--engine", "llama.cpp"]) == 2
    assert "draftheads engine eval llama.cpp" in capsys.readouterr().err
    # our loop's flags are not its own
    assert main(["engine", "eval", "llama.cpp", str(run), "--accept", "strict"]) == 2
    assert "unrecognized arguments: --accept strict; `draftheads engine eval --help`" in capsys.readouterr().err


def test_profile_prints_the_verify_cost_table_and_writes_its_files(tiny_target_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DRAFTHEADS_PROFILES", str(tmp_path / "profiles"))
    assert main(["profile", str(tiny_target_dir), "lookup", "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "verify forward, ms (decode steps)" in out and "| context |" in out and "prompt-lookup" in out
    saved = json.loads((tmp_path / "p" / "profile.json").read_text())
    assert saved["profile"]["forward_s"] and "prompt-lookup" in saved["drafters"]
    assert (tmp_path / "p" / "profile.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["profile", str(tmp_path / "no-such-target")]) == 2
    assert "error:" in capsys.readouterr().err


def test_config_flag_and_other_tools_names_are_accepted_with_a_note(monkeypatch, capsys, tmp_path):
    seen = []
    monkeypatch.setattr("draftheads.training.loop.run_training", lambda recipe, **kw: seen.append(recipe))
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("name: mine\nhead: {type: eagle, eagle3: true, ttt_length: 3}\ntrain: {learning_rate: 0.002}\n")
    assert main(["train", "--config", str(recipe), "gradient_accumulation_steps=4", "max_checkpoints=5"]) == 0
    assert main(["train", "eagle-smollm2", "head.eagle3=true", "train.resume_from=never",
                 "aux_hidden_state_layer_ids=[1,2,3]"]) == 0
    first, second = seen
    assert (first.head.ttt_steps, first.train.lr, first.train.grad_accum, first.train.keep_last) == (3, 0.002, 4, 5)
    assert second.train.resume == "never" and second.head.feature_layers == [1, 2, 3]
    err = capsys.readouterr().err
    assert "note: 'learning_rate' is train.lr in draftheads" in err and "note: 'ttt_length' is head.ttt_steps" in err
    assert ("note: head.eagle3: true is read as head.type: eagle3" in err
            and first.head.type == second.head.type == "eagle3")


def test_recipe_given_twice_or_an_alias_beside_its_name_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["train", "eagle-smollm2", "--config", "medusa-smollm2"])
    err = capsys.readouterr().err
    assert "usage: draftheads train" in err and "give the recipe once" in err
    assert main(["recipe", "show", "eagle-smollm2", "train.lr=1e-3", "learning_rate=1e-4", "--no-target"]) == 2
    assert "both 'learning_rate' and 'train.lr' are set; keep only train.lr" in capsys.readouterr().err


def test_a_sub_command_error_prints_that_sub_commands_usage(capsys):
    assert main(["export", "somewhere", "--format", "vllm", "--out", "x", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert ("usage: draftheads export" in err
            and err.splitlines()[-1].startswith("error: unrecognized arguments: --bogus;"))


DRIFT = ["drift", "run", "--target", "t"]
MONITOR = ["monitor", "http://127.0.0.1:9", "--baseline", "0.5"]
UPDATE = ["update-target", "data", "--out", "o"]
EXPORT = ["export", "run", "--format", "vllm", "--out", "o"]


@pytest.mark.parametrize("args, expected", [
    ([*DRIFT, "--rows", "0"], "drift --rows must be a whole number >= 1"),
    ([*DRIFT, "--rows", "-3"], "drift --rows must be a whole number >= 1"),
    ([*DRIFT, "--rows", "2.5"], "--rows: expected int, got float 2.5; give a whole number"),
    ([*DRIFT, "--rows", "many"], "--rows: expected int, got str 'many'"),
    ([*DRIFT, "--rows", "[1"], "--rows: expected int, got str '[1'"),
    ([*MONITOR, "--interval", "-1"], "--interval must be seconds in [0, 86400], got -1.0"),
    ([*MONITOR, "--interval", "nan"], "--interval must be seconds in [0, 86400], got nan"),
    ([*MONITOR, "--interval", "1e999"], "--interval must be seconds in [0, 86400], got inf"),
    ([*MONITOR, "--polls", "0"], "--polls must be a whole number >= 1"),
    ([*MONITOR, "--window", "1"], "(--window), got 1"),
    ([*MONITOR, "--window", "1e3"], "--window: expected int"),
    ([*MONITOR[:-1], "inf"], "(--baseline), got inf"),
    ([*MONITOR, "--tolerance", "nan"], "(--tolerance), got nan"),
    ([*UPDATE, "--steps", "0"], "update steps (--steps) must be a whole number >= 1"),
    ([*UPDATE, "--lr", "nan"], "update lr (--lr) must be a finite number > 0, got nan"),
    ([*UPDATE, "--lr", "inf"], "update lr (--lr) must be a finite number > 0, got inf"),
    ([*UPDATE, "--lr=-1e-4"], "update lr (--lr) must be a finite number > 0"),
    ([*UPDATE, "--rank", "0"], "update rank (--rank) must be a whole number >= 1"),
    ([*UPDATE, "--batch-size", "0"], "update batch_size (--batch-size) must be a whole number >= 1"),
    ([*UPDATE, "--requantize", "q4_0", "--steps", "-1"], "(--steps) must be a whole number >= 1"),
    ([*EXPORT, "--speculative-tokens", "0"], "--speculative-tokens must be a whole number >= 1"),
    ([*EXPORT, "--speculative-tokens", "3.5"], "--speculative-tokens: expected int, got float 3.5"),
])
def test_every_numeric_flag_is_checked_as_its_setting_before_any_work(args, expected, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and expected in err and "\n" not in err and ("; " in err or " must " in err)


@pytest.mark.parametrize("args, expected", [
    ([*EXPORT, "--push-to-hub", "my drafter"], "--push-to-hub 'my drafter' is not a hub repository id; give OWNER/"),
    ([*EXPORT, "--private"], "--private applies to the repository --push-to-hub creates; add --push-to-hub"),
])
def test_export_s_hub_flags_are_checked_before_any_work(args, expected, capsys):
    assert main(args) == 2   # 'run' does not exist: the settings were refused first
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and expected in err and "\n" not in err


def test_a_setting_s_flag_is_built_from_its_field_alone():
    """Each flag that sets a field is built from the field (its name, doc and choices), with no default or type of
    its own: the dataclass holds the default and the check, so the two cannot drift apart."""
    import argparse
    import typing

    from draftheads.cli import build_parser
    from draftheads.drift.acceptance_monitor import MonitorConfig, RetrainRule
    from draftheads.drift.drift_config import DriftConfig, UpdateConfig
    from draftheads.evaluation.eval_config import EngineEvalConfig, EvalConfig
    from draftheads.interop.export_config import ExportConfig

    def commands(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield name, sub
                    yield from commands(sub)

    classes = {"eval": [EvalConfig], "drift": [EvalConfig, DriftConfig], "monitor": [RetrainRule, MonitorConfig],
               "update-target": [UpdateConfig], "export": [ExportConfig]}
    parsers = dict(commands(build_parser()))
    parsers["engine eval"] = dict(commands(parsers["engine"]))["eval"]
    classes["engine eval"] = [EngineEvalConfig]
    for command, settings in classes.items():
        actions = {a.dest: a for a in parsers[command]._actions}
        for cls in settings:
            for f in dataclasses.fields(cls):
                flag = f.metadata.get("flag")
                if flag and f.name in actions:
                    action = actions[f.name]
                    assert flag in action.option_strings, (command, f.name)
                    assert action.default is None and action.type is None, (command, flag)
                    assert f.metadata["doc"].replace("%", "%%") in action.help, (command, flag)
                    if f.name in ("dtype", "combined", "method"):   # Literal settings: their options as choices
                        hint = typing.get_type_hints(cls)[f.name]
                        literal = next(a for a in (hint, *typing.get_args(hint))
                                       if typing.get_origin(a) is typing.Literal)
                        assert action.choices == list(typing.get_args(literal)), (command, flag)


def test_every_command_s_help_imports_no_torch():
    """The flags are built from the settings classes, which are plain Python: `--help` of every command stays quick."""
    code = ("import sys, contextlib, io\nfrom draftheads.cli import main\n"
            "for command in (['eval'], ['drift'], ['engine', 'eval'], ['update-target'], ['monitor'], ['export'],\n"
            "                ['profile'], ['recipe', 'show']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "        try:\n            main([*command, '--help'])\n        except SystemExit:\n            pass\n"
            "    assert 'usage: draftheads ' + ' '.join(command) in out.getvalue(), command\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'accelerate', 'datasets') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_yes_given_to_a_flag_is_noted_before_it_is_refused(capsys):
    assert main([*DRIFT, "--rows", "yes"]) == 2
    err = capsys.readouterr().err
    assert "note: --rows: 'yes' read as true (YAML 1.1)" in err
    assert err.strip().splitlines()[-1] == "error: --rows: expected int, got bool True; give a whole number"


def test_an_error_lands_on_its_own_line_with_no_progress_bar_drawn_after_it(monkeypatch, capsys):
    """A bar still drawn when an error ends the command would leave the error on its line, and draw over it."""
    import sys

    from tqdm.auto import tqdm

    from draftheads import cli
    from draftheads.core.errors import DraftheadsError

    def fails_mid_bar(args):
        outer, inner = tqdm(total=10, file=sys.stderr, mininterval=0), tqdm(total=5, file=sys.stderr, mininterval=0)
        outer.update(3)
        inner.update(1)
        raise DraftheadsError("the data ran out; give more")

    monkeypatch.setattr(cli, "cmd_recipe_list", fails_mid_bar)
    assert main(["recipe", "list"]) == 2
    import gc

    gc.collect()   # a bar left open would draw itself once more when collected
    err = capsys.readouterr().err
    before, line, after = err.rpartition("error: the data ran out; give more")
    assert line and after == "\n" and (before == "" or before.endswith(("\n", "\r")))
    assert "3/10" in before and not tqdm._instances
