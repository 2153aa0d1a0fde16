"""SmolLM2-135M-Instruct (Q4_1 GGUF) in int8 numerics gives the same logits bits in every
native variant (AVX-512 VNNI where the CPU has it, AVX2, baseline) and with the numpy
references (`NEEDLEPOINT_NATIVE=0`), each in a fresh process: the prefill tiles of 8 / 4 rows
(and their remainders), the one-row products, the attention and the quantiser of each
variant, end to end; and the same for the Qwen2, Qwen3 and Gemma 3 fixtures (Qwen2 through the
fused native block, Qwen3 and Gemma 3 kernel by kernel, Gemma's sliding-window attention
through `kernels.pinned.attend`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hf_helpers import SPEC_FIXTURES, SmolLM2Reference, hf_reference

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


def _every_variant(tmp_path: Path, path: str, ids: list[int], vocab: int) -> None:
    best, variant = _run(tmp_path, path, ids, "best")
    assert best.shape == (len(ids), vocab) and np.isfinite(best).all()
    runs = {"avx2": {"NEEDLEPOINT_NATIVE_VARIANT": "1"},
            "baseline": {"NEEDLEPOINT_NATIVE_VARIANT": "0"},
            "numpy": {"NEEDLEPOINT_NATIVE": "0"}}
    seen = {variant}
    for label, env in runs.items():
        logits, ran = _run(tmp_path, path, ids, label, **env)
        seen.add(ran)
        np.testing.assert_array_equal(logits, best, err_msg=f"{label} ({ran}) vs {variant}")
    assert {"baseline", "none"} <= seen  # the baseline C and the numpy reference did run


def test_every_variant_and_the_reference_give_the_same_logits(tmp_path) -> None:
    reference = SmolLM2Reference()
    ids = [int(t) for t in reference.prompts[0]["ids"]][:40]
    _every_variant(tmp_path, str(reference.path), ids, 49152)


@pytest.mark.parametrize("name", SPEC_FIXTURES)
def test_every_variant_gives_the_same_logits_for_the_new_families(tmp_path, name) -> None:
    ref = hf_reference(name)
    ids = [int(t) for t in ref["p3_ids"][:110]]  # past Gemma's 48-position window
    _every_variant(tmp_path, str(ref.folder), ids, ref["p3_logits"].shape[1])
