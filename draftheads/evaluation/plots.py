"""PNG plots of an evaluation report (matplotlib, Agg backend: no display needed).

    names = write_plots(folder, report["results"])   # -> ["acceptance_per_depth.png", ...]
    (speedup_vs_batch.png too when the rows hold more than one batch size)
"""

from __future__ import annotations

import collections
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt


def label(row: dict) -> str:
    return f"{row['drafter']} {row['rule']} T={row['temperature']:g}"


def plot_acceptance(rows: list[dict], path: Path) -> None:
    """Acceptance rate per draft depth, one line per drafter/rule/temperature."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        rates = row["acceptance_rates"]
        if rates:
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label(row))
    ax.set(xlabel="draft depth", ylabel="acceptance rate (given the depth was reached)", ylim=(0, 1.02),
           title="Acceptance per depth")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save(plt, fig, path)


def save(plt, fig, path: Path) -> None:
    """Write the figure as a PNG and free it (pyplot keeps every open figure alive)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_temperature(rows: list[dict], path: Path) -> None:
    """tau and wall-clock speedup against temperature, one line per drafter and rule."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    series = collections.defaultdict(list)
    for row in rows:
        series[(row["drafter"], row["rule"])].append(row)
    for (drafter, rule), group in series.items():
        group.sort(key=lambda r: r["temperature"])
        temps = [r["temperature"] for r in group]
        left.plot(temps, [r["tau"] for r in group], marker="o", label=f"{drafter} {rule}")
        right.plot(temps, [r["speedup"] or 0 for r in group], marker="o", label=f"{drafter} {rule}")
    left.set(xlabel="temperature", ylabel="tau (tokens per target forward, bonus included)", title="tau vs temperature")
    right.set(xlabel="temperature", ylabel="speedup over plain decoding (x)", title="Wall-clock speedup vs temperature")
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(plt, fig, path)


def plot_accepted_lengths(rows: list[dict], path: Path) -> None:
    """Share of steps that accepted n drafts: one panel per rule/temperature, grouped bars per drafter."""
    plt = _pyplot()
    panels = collections.defaultdict(list)
    for row in rows:
        panels[(row["rule"], row["temperature"])].append(row)
    cols = min(3, len(panels)) or 1
    rows_n = -(-len(panels) // cols) or 1
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.5 * cols, 3.6 * rows_n), squeeze=False)
    longest = max((len(r["accepted_hist"]) for r in rows), default=1)
    for ax, ((rule, temp), group) in zip(axes.flat, panels.items()):
        width = 0.8 / len(group)
        for i, row in enumerate(group):
            hist = row["accepted_hist"] + [0] * (longest - len(row["accepted_hist"]))
            total = sum(hist) or 1
            ax.bar([n - 0.4 + (i + 0.5) * width for n in range(longest)], [h / total for h in hist], width=width,
                   label=row["drafter"])
        ax.set(title=f"{rule}, T={temp:g}", xlabel="drafts accepted in a step", ylabel="share of steps",
               xticks=range(longest))
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    save(plt, fig, path)


def plot_speedup_vs_batch(rows: list[dict], path: Path) -> None:
    """Speedup (measured, and predicted before the run, dotted) and throughput against batch size, one line per
    drafter (tree), rule and temperature."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    series = collections.defaultdict(list)
    for row in rows:
        series[(row["drafter"], row["tree"], row["rule"], row["temperature"])].append(row)
    plain = {}
    for (drafter, tree, rule, temp), group in series.items():
        group.sort(key=lambda r: r["batch_size"])
        sizes = [r["batch_size"] for r in group]
        name = f"{drafter} [{tree}] {rule} T={temp:g}"
        line = left.plot(sizes, [r["speedup"] or 0 for r in group], marker="o", label=name)[0]
        predicted = [(r["batch_size"], r["predicted_speedup"]) for r in group if r.get("predicted_speedup")]
        if predicted:   # the same drafter's prediction, dashed in its colour
            left.plot(*zip(*predicted), ls=":", marker=".", color=line.get_color(), label=f"{name} predicted")
        right.plot(sizes, [r["tokens_per_s_spec"] for r in group], marker="o", label=name)
        plain.setdefault(temp if rule != "greedy" else 0.0, {}).update((r["batch_size"], r["tokens_per_s_plain"])
                                                                       for r in group)
    for temp, by_size in plain.items():
        sizes = sorted(by_size)
        right.plot(sizes, [by_size[b] for b in sizes], color="black", ls="--", marker="x", label=f"plain T={temp:g}")
    left.axhline(1.0, color="grey", lw=0.8, ls="--")
    left.set(xlabel="batch size", ylabel="speedup over plain decoding (x)", title="Speedup vs batch size")
    right.set(xlabel="batch size", ylabel="generated tokens/s (whole batch)", title="Throughput vs batch size")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["batch_size"] for r in rows}),
                      [str(b) for b in sorted({r["batch_size"] for r in rows})])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    save(plt, fig, path)


PLOTS = {
    "acceptance_per_depth.png": plot_acceptance,
    "tau_speedup_vs_temperature.png": plot_temperature,
    "accepted_lengths.png": plot_accepted_lengths,
}


def write_plots(folder: Path, rows: list[dict], by_kind: list[dict] = ()) -> list[str]:
    """Every plot of the report into `folder`; returns the file names written. The per-temperature plots show
    the smallest batch size measured (acceptance does not depend on it); the batch plot all of them; the task-kind
    plot the rows broken down by kind, when the prompts have kinds."""
    folder.mkdir(parents=True, exist_ok=True)
    smallest = min(r.get("batch_size", 1) for r in rows)
    names = []
    for name, plot in PLOTS.items():
        if name == "tau_speedup_vs_temperature.png" and len({r["temperature"] for r in rows}) < 2:
            continue   # one temperature: an axis of one point says nothing
        plot([r for r in rows if r.get("batch_size", 1) == smallest], folder / name)
        names.append(name)
    if len({r.get("batch_size", 1) for r in rows}) > 1:
        plot_speedup_vs_batch(rows, folder / "speedup_vs_batch.png")
        names.append("speedup_vs_batch.png")
    if by_kind:
        plot_tau_per_kind(list(by_kind), folder / "tau_per_task_kind.png")
        names.append("tau_per_task_kind.png")
    return names


def plot_tau_per_kind(rows: list[dict], path: Path) -> None:
    """tau per task kind, one bar per drafter/rule/temperature in each kind's group."""
    plt = _pyplot()
    kinds = list(dict.fromkeys(r["task_kind"] for r in rows))
    series = list(dict.fromkeys(label(r) for r in rows))
    tau = {(r["task_kind"], label(r)): r["tau"] for r in rows}
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(kinds)), 4.5))
    for j, name in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(kinds))]
        ax.bar(xs, [tau.get((k, name), 0) for k in kinds], width=width, label=name)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(kinds)), kinds, rotation=20)
    ax.set(ylabel="tau (tokens per target forward, bonus included)", title="tau per task kind")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    save(plt, fig, path)


def plot_drift(rows: list[dict], path: Path) -> None:
    """`draftheads drift`: each drafter's acceptance rate by depth on the old target (solid) and the new (dashed)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, row in enumerate(rows):
        color = f"C{i}"
        for key, style, when in (("acceptance_old", "-", "old"), ("acceptance_new", "--", "new")):
            rates = row.get(key) or []
            ax.plot(range(1, len(rates) + 1), rates, style, marker="o", color=color,
                    label=f"{row['drafter']} {row['rule']} ({when} target, tau {row['tau_' + when]:.2f})")
    ax.set_xlabel("draft depth")
    ax.set_ylabel("acceptance rate at that depth")
    ax.set_ylim(0, 1.05)
    ax.set_title("acceptance before and after the target update")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
