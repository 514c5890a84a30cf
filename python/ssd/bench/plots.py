"""PNG plots of a benchmark result (matplotlib, Agg backend)."""
from __future__ import annotations

import textwrap
from pathlib import Path

MODE_COLORS = {"ar": "#7f7f7f", "sd": "#1f77b4", "ssd": "#d62728"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path, dpi: int = 120, rect=None) -> Path:
    """Lays the figure out, writes it as a PNG (creating its folder) and closes it."""
    fig.tight_layout(**({} if rect is None else {"rect": rect}))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _own_hardware(result):
    return [r for r in result["runs"] if not r["same_total_hardware"]]


def write_plots(result: dict, directory: Path) -> list[Path]:
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    runs = _own_hardware(result)
    if "sweep" in result:
        # The per-mode plots would mix the pairs; the sweep plot and the speed model check do not.
        written = [write_sweep_plot(result["sweep"], directory)]
        path = _predicted_vs_measured(plt, runs, directory)
        return written + ([path] if path else [])
    tag = "constructed regime pair" if result["pair"].get("constructed") else "given pair"
    written = []

    # 1. Decode tokens/s per mode and dataset (batch 1 / lowest temperature when several).
    b0 = min(r["batch_size"] for r in runs)
    t0 = min(r["temperature"] for r in runs)
    datasets = sorted({r["dataset"] for r in runs})
    modes = [m for m in ("ar", "sd", "ssd") if any(r["mode"] == m for r in runs)]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(modes))
    for i, m in enumerate(modes):
        ys = [next((r["decode_tok_per_s"] for r in runs if (r["mode"], r["dataset"], r["batch_size"], r["temperature"])
                    == (m, d, b0, t0)), 0.0) for d in datasets]
        ax.bar([x + i * width for x in range(len(datasets))], ys, width, label=m, color=MODE_COLORS[m])
    ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(datasets))], datasets)
    ax.set_ylabel("decode tokens/s")
    ax.set_title(f"Decode speed per mode ({tag}, batch {b0}, T={t0})")
    ax.legend()
    written.append(_save(plt, fig, directory / "tokens_per_mode.png"))

    # 2. Tokens/s against batch size per mode (first dataset, lowest temperature).
    batches = sorted({r["batch_size"] for r in runs})
    if len(batches) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        for m in modes:
            pts = sorted((r["batch_size"], r["decode_tok_per_s"]) for r in runs
                         if r["mode"] == m and r["dataset"] == datasets[0] and r["temperature"] == t0)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=m, color=MODE_COLORS[m])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("decode tokens/s (all sequences)")
        ax.set_title(f"Throughput against batch size ({datasets[0]}, T={t0})")
        ax.legend()
        written.append(_save(plt, fig, directory / "tokens_vs_batch.png"))

    # 3. Cache hit rate and acceptance against temperature (ssd runs, first dataset, batch b0).
    temps = sorted({r["temperature"] for r in runs})
    ssd_runs = sorted((r for r in runs if r["mode"] == "ssd" and r["dataset"] == datasets[0]
                       and r["batch_size"] == b0), key=lambda r: r["temperature"])
    if len(temps) > 1 and ssd_runs:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r["temperature"] for r in ssd_runs], [r["cache_hit_rate"] for r in ssd_runs], "o-",
                label="ssd cache hit rate")
        ax.plot([r["temperature"] for r in ssd_runs], [r["acceptance_rate"] for r in ssd_runs], "s--",
                label="ssd acceptance rate")
        sd_runs = sorted((r for r in runs if r["mode"] == "sd" and r["dataset"] == datasets[0]
                          and r["batch_size"] == b0), key=lambda r: r["temperature"])
        if sd_runs:
            ax.plot([r["temperature"] for r in sd_runs], [r["acceptance_rate"] for r in sd_runs], "^:",
                    label="sd acceptance rate")
        ax.set_xlabel("temperature")
        ax.set_ylim(0, 1)
        ax.set_title(f"Hit rate and acceptance ({datasets[0]}, batch {b0})")
        ax.legend()
        written.append(_save(plt, fig, directory / "hit_rate_vs_temperature.png"))

    # 4. Predicted (isolated components) against measured speedup over ar.
    path = _predicted_vs_measured(plt, runs, directory)
    if path:
        written.append(path)
    return written


def _predicted_vs_measured(plt, runs: list[dict], directory: Path) -> Path | None:
    pts = [(r["predicted_speedup_isolated"], r["measured_speedup"], r["mode"]) for r in runs
           if r["mode"] != "ar" and r["predicted_speedup_isolated"] and r["measured_speedup"]]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5, 5))
    for m in ("sd", "ssd"):
        sel = [p for p in pts if p[2] == m]
        if sel:
            ax.scatter([p[0] for p in sel], [p[1] for p in sel], label=m, color=MODE_COLORS[m])
    hi = max(max(p[0], p[1]) for p in pts) * 1.1
    ax.plot([0, hi], [0, hi], "k:", label="measured = predicted")
    ax.fill_between([0, hi], [0, hi * 0.85], [0, hi * 1.15], color="k", alpha=0.07, label="+-15%")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("speed model (isolated component times): speedup over ar")
    ax.set_ylabel("measured speedup over ar")
    ax.set_title("Speed model check")
    ax.legend()
    return _save(plt, fig, directory / "predicted_vs_measured.png")


SWEEP_AXES = {"acceptance": "requested acceptance (teacher-forced top-1 agreement)",
              "cost_ratio": "cost ratio (draft cost / target cost)"}


def write_sweep_plot(sweep: dict, directory: Path) -> Path:
    """sweep_<parameter>.png: SSD over SD and over max(AR, SD) against the swept parameter, measured
    (markers) and predicted by the speed model (lines of the same colour), one series per dataset
    (and batch / temperature when several)."""
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    parameter, points = sweep["parameter"], sweep["points"]
    (fixed_name, fixed_value), = sweep["fixed"].items()
    series = sorted({(p["dataset"], p["batch_size"], p["temperature"]) for p in points})
    several_b = len({s[1] for s in series}) > 1
    several_t = len({s[2] for s in series}) > 1
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    panels = (("ssd_over_sd", "SSD / SD"), ("ssd_over_best", "SSD / max(AR, SD)"))
    for ax, (key, title) in zip(axes, panels):
        for i, (dataset, b, t) in enumerate(series):
            name = dataset + (f" B={b}" if several_b else "") + (f" T={t:g}" if several_t else "")
            sel = sorted((p for p in points if (p["dataset"], p["batch_size"], p["temperature"]) == (dataset, b, t)),
                         key=lambda p: p["value"])
            color = colors[i % len(colors)]
            measured = [(p["value"], p[key]) for p in sel if p[key] is not None]
            predicted = [(p["value"], p[f"predicted_{key}"]) for p in sel if p[f"predicted_{key}"] is not None]
            if measured:
                ax.plot(*zip(*measured), "o", color=color, markersize=7, label=f"{name} measured")
            if predicted:  # small crosses keep a lone prediction visible
                ax.plot(*zip(*predicted), "-x", color=color, alpha=0.8, markersize=5, label=f"{name} speed model")
        ax.axhline(1.0, color="k", linestyle="--", linewidth=1, label="1.0 (break-even)")
        ax.set_xticks(sorted({p["value"] for p in points}))
        ax.set_xlabel(SWEEP_AXES.get(parameter, parameter))
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("decode tok/s ratio (same target hardware)")
    # One legend for both panels: a series may have a point in one panel only.
    handles = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(handles.values(), handles.keys(), loc="center right", fontsize=9)
    fixed = SWEEP_AXES.get(fixed_name, fixed_name).split(" (")[0]
    fig.suptitle(f"SSD speedup against {parameter.replace('_', ' ')}: CONSTRUCTED regime pairs "
                 f"({fixed} fixed at {fixed_value:g}; not published models)")
    return _save(plt, fig, directory / f"sweep_{parameter}.png", rect=(0, 0, 0.85, 1))



def write_decode_plot(path: Path, rows: list[dict], meta: dict, machine: dict) -> Path:
    """Bars of decode tok/s per (dtype, threads) and engine (median, min-max whiskers), with the
    bandwidth bound of each group as a dashed line."""
    from .decode import DTYPES, ENGINES, engine_label

    plt = _pyplot()
    groups = sorted({(r["dtype"], r["threads"]) for r in rows}, key=lambda g: (DTYPES.index(g[0]), g[1]))
    engines = sorted({engine_label(r) for r in rows}, key=lambda e: (ENGINES.index(e.split()[0]), e))
    by_key = {(engine_label(r), r["dtype"], r["threads"]): r for r in rows}
    width = 0.8 / len(engines)
    # the peers keep one color each; ssd's rows (one per instruction set) take the others in turn
    peers = {"transformers": "#ff7f0e", "llamacpp": "#8c564b"}
    palette = ["#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#e377c2"]
    own = [e for e in engines if e not in peers]
    colors = {e: peers.get(e) or palette[own.index(e) % len(palette)] for e in engines}
    fig, ax = plt.subplots(figsize=(3.6 + 2.0 * len(groups), 4.5))
    for j, engine in enumerate(engines):
        xs, heights, errs = [], [], [[], []]
        for i, g in enumerate(groups):
            r = by_key.get((engine, *g))
            if r is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            heights.append(r["tok_s"])
            errs[0].append(r["tok_s"] - r["tok_s_min"])
            errs[1].append(r["tok_s_max"] - r["tok_s"])
        bars = ax.bar(xs, heights, width, yerr=errs, capsize=3, label=engine, color=colors[engine])
        ax.bar_label(bars, fmt="%.1f", padding=2, fontsize=8)
    for i, g in enumerate(groups):
        bound = next(r["bound_tok_s"] for r in rows if (r["dtype"], r["threads"]) == g)
        ax.hlines(bound, i - 0.45, i + 0.45, colors="k", linestyles="--", linewidth=1.2,
                  label="bandwidth bound" if i == 0 else None)
    ax.set_xticks(range(len(groups)), [f"{d}\n{t} thread{'s' if t > 1 else ''}" for d, t in groups])
    ax.set_ylabel("decode tokens/s (batch 1)")
    ax.set_title(f"SmolLM2-135M-Instruct decode, {meta['max_tokens']} new tokens, "
                 f"{meta['prompt_tokens']}-token prompt (bars: median, whiskers: min-max)\n"
                 f"{machine['cpu_model']}, {machine['cpus']} logical CPUs", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, path)


FALLBACK_STYLES = {"ar": ("#7f7f7f", "o", "ar"), "sd": ("#1f77b4", "s", "sd"),
                   "ssd_neural": ("#d62728", "^", "ssd, neural fallback"),
                   "ssd_fast": ("#ff7f0e", "v", "ssd, fast (n-gram) fallback"),
                   "ssd_auto": ("#2ca02c", "D", "ssd, auto")}


def write_fallback_plot(path: Path, rows: list[dict], title: str) -> Path:
    """Decode tok/s against batch size, one panel per temperature: ar, sd and ssd with each fallback."""
    plt = _pyplot()
    temps = sorted({x["temperature"] for x in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(max(7.5, 6 * len(temps)), 4.4), squeeze=False)
    for ax, t in zip(axes[0], temps):
        sel = [x for x in rows if x["temperature"] == t]
        batches = [x["batch_size"] for x in sel]
        for key, (color, marker, label) in FALLBACK_STYLES.items():
            ax.plot(batches, [x[key] for x in sel], marker=marker, color=color, label=label,
                    linestyle="--" if key == "ssd_auto" else "-")
        _batch_axes(ax, batches, "decode tokens/s (all sequences)", f"temperature {t:g}")
    axes[0][0].legend(fontsize=8)
    # A one-panel figure is narrow: wrap the title rather than cut it.
    fig.suptitle(textwrap.fill(title, 90 if len(temps) > 1 else 80), fontsize=10)
    return _save(plt, fig, path, dpi=110)


def _batch_axes(ax, batches: list[int], ylabel: str, title: str) -> None:
    """A panel over batch size: log2 x axis ticked at the batches run, labels, title and grid."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)


def write_coupling_plot(path: Path, runs: list[dict]) -> Path:
    """Grouped bars per (dataset, temperature): decode tok/s of ar and of sd and ssd under each coupling
    (ssd at each C), with each speculative run's acceptance written above its bar."""
    plt = _pyplot()
    points = sorted({(r["dataset"], r["temperature"]) for r in runs})
    kinds = []
    for r in runs:
        kind = (r["mode"], r["coupling"] if r["mode"] != "ar" else "", r["saguaro_c"] if r["mode"] == "ssd" else None)
        if kind not in kinds:
            kinds.append(kind)
    width = 0.8 / len(kinds)
    fig, ax = plt.subplots(figsize=(max(8.0, 2.2 * len(points)), 4.6))
    for i, (mode, coupling, c) in enumerate(kinds):
        xs, ys, accs = [], [], []
        for j, point in enumerate(points):
            r = next((r for r in runs if (r["dataset"], r["temperature"]) == point and r["mode"] == mode
                      and (mode == "ar" or r["coupling"] == coupling) and (mode != "ssd" or r["saguaro_c"] == c)), None)
            if r is not None:
                xs.append(j - 0.4 + (i + 0.5) * width)
                ys.append(r["decode_tok_per_s"])
                accs.append(r.get("acceptance_rate") if mode != "ar" else None)
        label = mode if mode == "ar" else f"{mode} {coupling}" + (f" C={c:g}" if c is not None else "")
        bars = ax.bar(xs, ys, width, label=label, color=MODE_COLORS[mode],
                      alpha=1.0 if coupling in ("gumbel", "") else 0.45,
                      hatch="//" if c is not None and c < 1 else None, edgecolor="white")
        for bar, acc in zip(bars, accs):
            if acc is not None:
                ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{acc:.2f}", ha="center",
                        va="bottom", fontsize=6)
    ax.set_xticks(range(len(points)), [f"{d}\nT={t:g}" for d, t in points])
    ax.set_ylabel("decode tokens/s (batch 1)")
    ax.set_title("sd and ssd under the rejection and the Gumbel coupling (numbers: acceptance)", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, path, dpi=110)


# variant -> (colour, line style, line width): adaptive solid and bold, fixed dashed, ar on 2 threads dotted.
ADAPTIVE_STYLES = {"ar": (MODE_COLORS["ar"], "--", 1.2), "ar 2thr": (MODE_COLORS["ar"], ":", 1.2),
                   "sd": (MODE_COLORS["sd"], "--", 1.2), "ssd": (MODE_COLORS["ssd"], "--", 1.2),
                   "sd adaptive": (MODE_COLORS["sd"], "-", 2.6), "ssd adaptive": (MODE_COLORS["ssd"], "-", 2.6)}


def write_adaptive_plot(path: Path, points: list[dict]) -> Path:
    """Median decode tok/s against batch size (log2 axis), one panel per (dataset, temperature) and one
    line per variant; `points` are ``ssd.bench.adaptive.summarize``'s (each with "tok_per_s" per variant)."""
    plt = _pyplot()
    panels = sorted({(p["dataset"], p["temperature"]) for p in points})
    fig, axes = plt.subplots(1, len(panels), figsize=(max(7.0, 5.2 * len(panels)), 4.4), squeeze=False)
    for ax, (dataset, t) in zip(axes[0], panels):
        sel = sorted((p for p in points if (p["dataset"], p["temperature"]) == (dataset, t)),
                     key=lambda p: p["batch_size"])
        batches = [p["batch_size"] for p in sel]
        for variant, (color, style, width) in ADAPTIVE_STYLES.items():
            xy = [(p["batch_size"], p["tok_per_s"][variant]) for p in sel if p["tok_per_s"].get(variant) is not None]
            if xy:
                ax.plot(*zip(*xy), marker="o", markersize=4, color=color, linestyle=style, linewidth=width,
                        label=variant)
        _batch_axes(ax, batches, "median decode tokens/s (all sequences)", f"{dataset}, temperature {t:g}")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("adaptive speculation against the fixed modes (solid: adaptive, dashed: fixed, "
                 "dotted: ar on 2 threads)", fontsize=10)
    return _save(plt, fig, path, dpi=110)
