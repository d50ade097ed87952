"""The retrain rule: silent at the baseline's own rate, firing once a real drop fills its window; counters read from
a server's /metrics text, as llama-server and vLLM write it."""

import http.server
import math
import threading

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.drift.acceptance_monitor import (
    AcceptanceMonitor,
    BadPoll,
    MonitorConfig,
    Notes,
    RetrainRule,
    counter,
    ratio_standard_error,
    read_counters,
    watch,
)


def requests(rate: float, n: int, drafted: int = 40, swing: float = 0.1):
    """n requests at about `rate`, alternating above and below it by `swing` (request-to-request spread)."""
    return [(drafted, round(drafted * (rate + (swing if i % 2 else -swing)))) for i in range(n)]


def test_the_rule_stays_silent_at_the_baseline_and_fires_on_a_drop():
    rule = RetrainRule(baseline=0.6, tolerance=0.15, window=10, min_observations=4)
    steady = AcceptanceMonitor(rule)
    assert not any(steady.observe(d, a).retrain for d, a in requests(0.6, 40))
    assert steady.fired_at is None
    dropped = AcceptanceMonitor(rule)
    for d, a in requests(0.6, 10) + requests(0.3, 10):
        dropped.observe(d, a)
    assert dropped.fired_at is not None and 11 <= dropped.fired_at <= 20   # only after the drop came in


def test_a_drop_within_the_tolerance_does_not_fire():
    monitor = AcceptanceMonitor(RetrainRule(baseline=0.6, tolerance=0.15, window=10, min_observations=4))
    for d, a in requests(0.55, 30, swing=0.02):
        monitor.observe(d, a)
    assert monitor.fired_at is None


def test_nothing_fires_before_min_observations():
    monitor = AcceptanceMonitor(RetrainRule(baseline=0.9, window=10, min_observations=5))
    verdicts = [monitor.observe(*r) for r in requests(0.1, 5, swing=0.0)]
    assert [v.retrain for v in verdicts] == [False] * 4 + [True] and monitor.fired_at == 5


def test_requests_without_drafts_are_skipped_and_bad_counts_refused():
    monitor = AcceptanceMonitor(RetrainRule(baseline=0.5))
    assert monitor.observe(0, 0).rate is None and monitor.verdict().observations == 0
    with pytest.raises(DraftheadsError, match="accepted <= drafted"):
        monitor.observe(3, 4)


def test_ratio_standard_error_by_hand():
    obs = [(10, 5), (20, 14), (10, 3)]
    rate = 22 / 40
    residuals = [5 - rate * 10, 14 - rate * 20, 3 - rate * 10]
    expected = math.sqrt(sum(r * r for r in residuals) / 2 / 3) / (40 / 3)
    assert ratio_standard_error(obs, rate) == pytest.approx(expected)
    assert ratio_standard_error([(10, 5)], 0.5) == math.inf


@pytest.mark.parametrize("bad, match", [({"baseline": 0.0}, "baseline"), ({"baseline": 0.5, "tolerance": 1.0},
                                        "tolerance"), ({"baseline": 0.5, "window": 1}, "window")])
def test_bad_rules_are_one_line_errors(bad, match):
    with pytest.raises(DraftheadsError, match=match):
        RetrainRule(**bad)


LLAMA = """# HELP llamacpp:spec_decode_num_draft_tokens_total Total draft tokens
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 120
llamacpp:spec_decode_num_accepted_tokens_total 75
llamacpp:spec_decode_num_drafts_total 40
"""
VLLM = """vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 100.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 2.1e2
"""


def test_counters_are_read_from_llama_server_and_vllm_metrics():
    assert counter(LLAMA, "spec_decode_num_draft_tokens_total", "u") == 120
    assert counter(LLAMA, "spec_decode_num_accepted_tokens_total", "u") == 75
    assert counter(VLLM, "spec_decode_num_draft_tokens_total", "u") == 400
    assert counter(VLLM, "spec_decode_num_accepted_tokens_total", "u") == 210
    with pytest.raises(DraftheadsError, match="drafts nothing"):
        counter("llamacpp:n_decode_total 3\n", "spec_decode_num_draft_tokens_total", "u")


class Metrics(http.server.BaseHTTPRequestHandler):
    """Counters that grow by 40 drafted per poll, accepted at 0.6 for 6 polls, then at 0.2."""

    polls = 0

    def do_GET(self):
        cls = type(self)
        n = cls.polls
        accepted = sum(24 if i < 6 else 8 for i in range(n))
        body = (f"llamacpp:spec_decode_num_draft_tokens_total {40 * n}\n"
                f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}\n").encode()
        cls.polls += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_watch_polls_a_server_and_stops_when_the_rule_fires():
    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert read_counters(url) == (0, 0)
        Metrics.polls = 0
        lines = []
        monitor = watch(url, RetrainRule(baseline=0.6, window=4, min_observations=3), interval_s=0.01, polls=20,
                        stop_when_fired=True, progress=lines.append)
    finally:
        server.shutdown()
    assert monitor.fired_at is not None and monitor.fired_at > 6 and "RETRAIN" in lines[-1]
    with pytest.raises(DraftheadsError, match="cannot read"):
        read_counters(url)


def serve(bodies: list[bytes]):
    """A local /metrics that answers each GET with the next of `bodies` (the last one from then on); its URL and
    a stop function."""
    answers = list(bodies)

    class Scripted(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = answers.pop(0) if len(answers) > 1 else answers[0]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server.shutdown


def metrics(drafted, accepted) -> bytes:
    return (f"llamacpp:spec_decode_num_draft_tokens_total {drafted}\n"
            f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}\n").encode()


def watched(bodies, polls, **kw):
    """watch() over `bodies`: (monitor, progress lines, notes, the error's text or None)."""
    url, stop = serve(bodies)
    lines, said = [], []
    try:
        monitor = watch(url, RetrainRule(baseline=0.6, window=4, min_observations=2), interval_s=0, polls=polls,
                        progress=lines.append, notes=Notes(said.append), **kw)
        return monitor, lines, said, None
    except DraftheadsError as e:
        return None, lines, said, str(e)
    finally:
        stop()


@pytest.mark.parametrize("value, kind", [("1.2.3", "not a number"), ("12abc", "not a number"), ("1e999", "not a count"),
                                         ("+Inf", "not a count"), ("NaN", "not a count"), ("-3", "not a count"),
                                         ("1e300", "not a count")])
def test_a_counter_that_holds_no_count_is_a_bad_poll_of_one_line(value, kind):
    text = f"llamacpp:spec_decode_num_draft_tokens_total {value}\n"
    with pytest.raises(BadPoll) as caught:
        counter(text, "spec_decode_num_draft_tokens_total", "u")
    message = str(caught.value)
    assert caught.value.kind == kind and "\n" not in message and "; fix the server's metrics" in message


def test_samples_with_a_timestamp_are_read_and_a_sum_past_2_to_the_53_refused():
    text = "vllm:spec_decode_num_draft_tokens_total{engine=\"0\"} 40 1700000000000\n"
    assert counter(text, "spec_decode_num_draft_tokens_total", "u") == 40
    huge = "a:spec_decode_num_draft_tokens_total{e=\"0\"} 6e15\na:spec_decode_num_draft_tokens_total{e=\"1\"} 6e15\n"
    with pytest.raises(BadPoll, match="sums to"):
        counter(huge, "spec_decode_num_draft_tokens_total", "u")


def test_undecodable_bytes_outside_the_counters_are_noted_once_and_inside_them_a_bad_poll():
    url, stop = serve([b"# HELP caf\xe9\n" + metrics(40, 24),
                       b"llamacpp:spec_decode_num_draft_tokens_total \xff\xfe\n"])
    said = []
    notes = Notes(said.append)
    try:
        assert read_counters(url, notes) == (40, 24)
        with pytest.raises(BadPoll, match="not a number"):
            read_counters(url, notes)
    finally:
        stop()
    assert len(said) == 1 and "is not UTF-8 text (byte 0xe9" in said[0] and said[0].startswith("note: ")


@pytest.mark.parametrize("bad", [b"llamacpp:spec_decode_num_draft_tokens_total 1.2.3\n",
                                 metrics("1e999", 3), metrics(40, "NaN")])
def test_one_bad_poll_is_skipped_with_a_note_and_two_in_a_row_stop_the_monitor(bad):
    # polls: 40/24, 80/48, bad, 160/96 (two intervals in one), bad, 200/120, then bad for good
    bodies = [metrics(0, 0), metrics(40, 24), metrics(80, 48), bad, metrics(160, 96), bad, metrics(200, 120), bad]
    monitor, lines, said, error = watched(bodies, polls=20)
    assert monitor is None and len(lines) == 4 and all("acceptance 0.600" in line for line in lines)
    assert len(said) == 1 and said[0].startswith("note: ") and "the poll is skipped" in said[0]
    assert error.startswith("2 polls in a row read nothing usable, the last: ") and "\n" not in error


def test_the_first_poll_must_read_cleanly():
    monitor, lines, said, error = watched([metrics("1.2.3", 0), metrics(40, 24)], polls=3)
    assert monitor is None and "is '1.2.3', not a number; fix the server's metrics" in error


def test_counters_that_go_back_are_a_restart_counted_from_zero_and_noted_once():
    bodies = [metrics(400, 240), metrics(440, 264), metrics(40, 24), metrics(80, 48), metrics(20, 12), metrics(60, 36)]
    monitor, lines, said, error = watched(bodies, polls=5)
    assert error is None and len(lines) == 5 and monitor.seen == 5   # each restart's interval is 40 / 24 or 20 / 12
    assert all("acceptance 0.600" in line for line in lines)
    assert len(said) == 1 and "the server restarted" in said[0]


def test_an_interval_accepting_more_than_it_drafted_is_skipped_with_a_note():
    monitor, lines, said, error = watched([metrics(0, 0), metrics(40, 50), metrics(80, 74)], polls=2)
    assert error is None and monitor.seen == 1 and len(said) == 1 and "40 drafted" in said[0]


@pytest.mark.parametrize("interval, polls, match", [(-1.0, None, "--interval"), (math.nan, None, "--interval"),
                                                    (math.inf, None, "--interval"), (1e12, None, "--interval"),
                                                    (0.0, 0, "--polls")])
def test_the_interval_and_the_polls_are_checked_before_any_poll(interval, polls, match):
    with pytest.raises(DraftheadsError, match=match):
        MonitorConfig(interval=interval, polls=polls)
    with pytest.raises(DraftheadsError, match=match):   # the API too, before it reads anything
        watch("http://127.0.0.1:9", RetrainRule(baseline=0.5), interval_s=interval, polls=polls)


@pytest.mark.parametrize("url", ["foo", "127.0.0.1:8080", "http://[::1", "ftp://127.0.0.1/"])
def test_an_address_that_is_no_http_server_is_one_line(url):
    with pytest.raises(DraftheadsError, match="is not a server's address; give it as http://HOST:PORT"):
        read_counters(url)


def test_the_rule_waits_for_8_observations_or_the_whole_window_when_smaller():
    assert RetrainRule(baseline=0.5).min_observations == 8
    assert RetrainRule(baseline=0.5, window=4).min_observations == 4
