"""SmolLM2-135M-Instruct (Q4_1 GGUF) in int8 numerics gives the same logits bits in every
native variant (AVX-512 VNNI where the CPU has it, AVX2, baseline) and with the numpy
references (`NEEDLEPOINT_NATIVE=0`), each in a fresh process: the prefill tiles of 8 / 4 rows
(and their remainders), the one-row products, the attention and the quantiser of each
variant, end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from hf_helpers import SmolLM2Reference

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = """
import sys
import numpy as np
import needlepoint
from needlepoint.kernels import i8_native
model = needlepoint.load(sys.argv[1], numerics="int8")
ids = [int(t) for t in sys.argv[3].split(",")]
session = model.session(chunk=21)  # chunks of 21: tiles of 8 / 4 and their remainders
logits = [session.run(ids[:-3], "all")] + [session.step(t)[None] for t in ids[-3:]]
np.save(sys.argv[2], np.concatenate(logits))
print(i8_native.simd_variant())
"""


def _run(tmp_path: Path, path: str, ids: list[int], label: str, **env: str) -> tuple:
    out = tmp_path / f"{label}.npy"
    src = str(REPO_ROOT / "src")
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = os.pathsep.join([src] + ([full["PYTHONPATH"]] if full.get("PYTHONPATH")
                                                  else []))
    done = subprocess.run([sys.executable, "-c", SCRIPT, path, str(out),
                           ",".join(map(str, ids))], check=True, env=full, cwd=REPO_ROOT,
                          timeout=600, capture_output=True, text=True)
    return np.load(out), done.stdout.strip()


def test_every_variant_and_the_reference_give_the_same_logits(tmp_path) -> None:
    reference = SmolLM2Reference()
    ids = [int(t) for t in reference.prompts[0]["ids"]][:40]
    best, variant = _run(tmp_path, str(reference.path), ids, "best")
    assert best.shape == (len(ids), 49152) and np.isfinite(best).all()
    runs = {"avx2": {"NEEDLEPOINT_NATIVE_VARIANT": "1"},
            "baseline": {"NEEDLEPOINT_NATIVE_VARIANT": "0"},
            "numpy": {"NEEDLEPOINT_NATIVE": "0"}}
    seen = {variant}
    for label, env in runs.items():
        logits, ran = _run(tmp_path, str(reference.path), ids, label, **env)
        seen.add(ran)
        np.testing.assert_array_equal(logits, best, err_msg=f"{label} ({ran}) vs {variant}")
    assert {"baseline", "none"} <= seen  # the baseline C and the numpy reference did run
