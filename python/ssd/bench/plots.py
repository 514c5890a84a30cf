"""PNG plots of a benchmark result (matplotlib, Agg backend)."""
from __future__ import annotations

from pathlib import Path

MODE_COLORS = {"ar": "#7f7f7f", "sd": "#1f77b4", "ssd": "#d62728"}


def _own_hardware(result):
    return [r for r in result["runs"] if not r["same_total_hardware"]]


def write_plots(result: dict, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    runs = _own_hardware(result)
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
    fig.tight_layout()
    written.append(directory / "tokens_per_mode.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

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
        fig.tight_layout()
        written.append(directory / "tokens_vs_batch.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)

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
        fig.tight_layout()
        written.append(directory / "hit_rate_vs_temperature.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)

    # 4. Predicted (isolated components) against measured speedup over ar.
    pts = [(r["predicted_speedup_isolated"], r["measured_speedup"], r["mode"]) for r in runs
           if r["mode"] != "ar" and r["predicted_speedup_isolated"] and r["measured_speedup"]]
    if pts:
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
        fig.tight_layout()
        written.append(directory / "predicted_vs_measured.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written
