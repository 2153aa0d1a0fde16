"""Consistency checks over a run's results: did both engines see the same ids, and where do
their greedy tokens agree? Stored in the results JSON (`checks`) and listed in the report."""

from __future__ import annotations

from .engines import NEEDLE_RS, NP_DEPLOY, NP_FLOAT


def consistency_checks(results: dict) -> dict:
    """Did both engines see the same ids? Prompt lengths, first tokens, greedy agreement."""
    lengths = {p["name"]: p["length"] for p in results.get("prompts", [])}
    out: dict = {"prompt_tokens": [], "first_token": [], "decode": []}
    for t, raw in results.get("timing", {}).get("raw", {}).items():
        engs = raw.get("engines", {})
        rs = engs.get(NEEDLE_RS, {}).get("checks", {})
        for key, c in rs.items():
            name = key.split(":", 1)[1]
            out["prompt_tokens"].append(
                {
                    "threads": int(t),
                    "workload": key,
                    "ids_sent_to_needlepoint": lengths.get(name),
                    "needle_rs_reported": c.get("prompt_tokens"),
                    "match": c.get("prompt_tokens") == [lengths.get(name)],
                }
            )
        for np_name in (NP_FLOAT, NP_DEPLOY):
            mine = engs.get(np_name, {}).get("checks", {})
            for key, c in mine.items():
                r = rs.get(key)
                if not r:
                    continue
                if key.startswith("prefill:"):
                    out["first_token"].append(
                        {
                            "threads": int(t),
                            "workload": key,
                            "engine": np_name,
                            "needle_rs": r.get("first_token"),
                            "needlepoint": c.get("first_token"),
                            "agree": r.get("first_token") == c.get("first_token"),
                        }
                    )
                else:
                    a, b = c.get("tokens") or [], r.get("tokens") or []
                    k = 0
                    while k < min(len(a), len(b)) and a[k] == b[k]:
                        k += 1
                    out["decode"].append(
                        {
                            "threads": int(t),
                            "workload": key,
                            "engine": np_name,
                            "greedy_tokens_agreeing_from_start": k,
                            "of": min(len(a), len(b)),
                            "needle_rs_stop_reason": r.get("stop_reason"),
                        }
                    )
        for key, c in rs.items():
            if key.startswith("decode:"):
                out.setdefault("needle_rs_decode", []).append(
                    {
                        "threads": int(t),
                        "stop_reason": c.get("stop_reason"),
                        "tokens_generated": len(c.get("tokens") or []),
                    }
                )
    out["all_prompt_lengths_match"] = all(x["match"] for x in out["prompt_tokens"])
    return out
