"""``bench gpu --draft-sm-shares``: ssd at batch 1 with its draft confined to a
share of the target's GPU (``EngineConfig.draft_sm_share``, a CUDA green
context) against the same run with stream priority alone (share 0, the
default placement's run of the main table). What decides which of the two
is the default where the draft shares the target's GPU (docs/gpu.md).
"""
from __future__ import annotations


def compare(run_mode, target, draft, prompt: list[int], args, common: dict, runs: list[dict]) -> dict:
    """One ssd batch-1 run per share in args.draft_sm_shares, each beside `runs`' batch-1 ssd and ar
    runs: tok/s, over_priority (tok/s over the stream-priority run's) and matches_ar."""
    if not args.draft_sm_shares:
        return {"runs": [], "why": "no --draft-sm-shares"}
    if not args.device.startswith("cuda"):
        return {"runs": [], "why": f"not measured on {args.device}: green contexts are a CUDA GPU's"}
    first = {r["mode"]: r for r in runs if r["batch"] == 1 and "error" not in r}
    priority, ar = first.get("ssd"), first.get("ar")
    rows = []
    for share in args.draft_sm_shares:
        r = run_mode(target, draft, "ssd", [prompt], args, common, draft_device=args.device, draft_sm_share=share)
        r["draft_sm_share"] = share
        if "error" not in r:
            r["matches_ar"] = ar is not None and r["token_ids"] == ar["token_ids"]
            r["over_priority"] = r["tok_s"] / priority["tok_s"] if priority else None
        rows.append(r)
    return {"priority_tok_s": priority["tok_s"] if priority else None, "runs": rows}


def format_compare(result: dict) -> str:
    if not result["runs"]:
        return f"draft on a share of the SMs: {result['why']}"
    lines = [f"ssd batch 1, draft on a share of the SMs (green context) against stream priority "
             f"({_num(result['priority_tok_s'], '.1f')} tok/s):"]
    for r in result["runs"]:
        if "error" in r:
            lines.append(f"  share {r['draft_sm_share']:.2f}: error: {r['error']}")
        else:
            lines.append(f"  share {r['draft_sm_share']:.2f}: {r['tok_s']:.1f} tok/s, "
                         f"{_num(r['over_priority'], '.2f')}x priority's, = ar: {r['matches_ar']}")
    return "\n".join(lines)


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)
