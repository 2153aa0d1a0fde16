"""`needlepoint inspect MODEL`: what an archive holds, without running it (a GGUF file or a
Hugging Face directory: `inspect_checkpoint.py`).

Prints the generation, the geometry (the typed header config), one row per directory record
(name, role, storage, shape, bit width, bytes), the tokenizer size and the probe heads
present. `--json` prints the same as one JSON object for machines (`summarize`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import struct
import sys
from typing import Any

from ..errors import CactFormatError
from ..formats import needle2_geometry as v2config
from ..formats import needle3_geometry as v3config
from ..formats.cact import CactArchive, TensorRecord, open_archive

HELP = ("show what a model file holds: a .cact archive's generation, geometry, tensors, "
        "tokenizer and heads; a GGUF file's or HF directory's architecture, geometry, tensor "
        "types, parameters, bytes, chat template and call syntax")

STORAGE_BITS = {"fp16": 16, "fp32": 32}
NOT_PARAMETERS = {"hada_p1", "hada_p2", "heads.manifest"}

# Role of a record, from the last part of its name (README record lists).
_LAYER_ROLES = {
    "norm_in": "norm", "q_norm": "norm", "k_norm": "norm", "post_norm": "norm",
    "pre_hada": "norm",
    "q_proj": "attention", "k_proj": "attention", "v_proj": "attention",
    "gate_proj": "attention", "out_proj": "attention", "attn_gate": "attention",
    "q_taps": "attention conv", "k_taps": "attention conv", "v_taps": "attention conv",
}
_LAYER_RE = re.compile(r"layer\d+\.(\w+)")
_ENGRAM_RE = re.compile(r"engram\d+\.(\w+)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="a .cact archive, a .gguf file or a "
                        "Hugging Face safetensors directory")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of tables"
    )
    parser.add_argument(
        "--verify", action="store_true",
        help="also decode every tensor and check its values are finite (exit 2 if not)",
    )


def run(args: argparse.Namespace) -> int:
    from ..formats.checkpoints import is_checkpoint

    if is_checkpoint(args.model):  # a GGUF file or a Hugging Face directory
        from .inspect_checkpoint import render_checkpoint, summarize_checkpoint

        if args.verify:
            raise CactFormatError(f"{args.model}: --verify checks .cact archives only")
        summary = summarize_checkpoint(args.model)
        if args.json:
            json.dump(summary, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            render_checkpoint(summary)
        return 0
    try:
        archive = open_archive(args.model)
        summary = summarize(archive)
    except CactFormatError as error:
        hint = "" if "format tag" not in str(error) else (
            "; inspect reads .cact archives, .gguf files and Hugging Face model directories "
            "(a config.json beside safetensors)")
        if str(error).startswith(str(args.model)):
            raise CactFormatError(f"{error}{hint}") from error
        raise CactFormatError(f"{args.model}: {error}{hint}") from error
    report = None
    if args.verify:
        from .verify import describe, verify

        report = summary["verify"] = verify(archive)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(summary)
        if report is not None and not report["bad"]:
            print(describe(report))
    if report is not None and report["bad"]:
        sys.stdout.flush()
        raise CactFormatError(f"{args.model}: {describe(report)}")
    return 0


# -- the summary ------------------------------------------------------------------------------
def role(name: str) -> str:
    """A short human label for what a record is used for."""
    if name == "embedding":
        return "embedding / LM head"
    if name == "final_norm":
        return "norm"
    if name == "tokenizer":
        return "tokenizer"
    if name == "heads.manifest":
        return "head manifest"
    if name.startswith("mhc_"):
        return "mHC routing"
    if name.startswith("hada_p"):
        return "Hadamard MLP"
    if match := _LAYER_RE.fullmatch(name):
        return _LAYER_ROLES.get(match.group(1), "Hadamard MLP")
    if match := _ENGRAM_RE.fullmatch(name):
        part = match.group(1)
        return "engram " + ("table" if part == "tables" else "taps" if part == "taps" else "proj")
    if "_head." in name:
        return name.split(".")[0].replace("_", " ")
    return "?"


def bit_width(record: TensorRecord) -> int | None:
    """Bits per stored value: the CQ width, 16/32 for floats, None for raw bytes."""
    if record.dtype == "cq":
        return record.bits
    return STORAGE_BITS.get(record.dtype)


def tokenizer_size(archive: CactArchive) -> tuple[int, str]:
    """(vocabulary size, where it came from). Parses the tokenizer blob when the tokenizer
    module is available (a corrupt blob is a CactFormatError); otherwise reads n_pieces."""
    try:
        return archive.tokenizer.vocab_size, "tokenizer"
    except ImportError:
        pass
    blob = archive.tokenizer_blob
    record = archive.records[-1]
    if len(blob) < 4:
        raise CactFormatError(
            f"directory[{record.index}] (tokenizer) (byte offset {record.offset}): "
            f"{len(blob)}-byte blob has no n_pieces field"
        )
    return struct.unpack_from("<I", blob, 0)[0], "blob header n_pieces"


def summarize(archive: CactArchive) -> dict[str, Any]:
    """Everything `inspect` shows, as plain JSON-ready data."""
    geometry = dataclasses.asdict(archive.config)
    geometry = {key: list(v) if isinstance(v, tuple) else v for key, v in geometry.items()}
    tag = v3config.FORMAT_TAG if archive.generation == 3 else v2config.FORMAT_TAG
    tensors = [
        {
            "index": record.index,
            "name": record.name,
            "role": role(record.name),
            "dtype": record.dtype,
            "shape": list(record.shape),
            "bits": bit_width(record),
            "group": record.group if record.dtype == "cq" else None,
            "offset": record.offset,
            "nbytes": record.nbytes,
        }
        for record in archive.records
    ]
    vocab_size, source = tokenizer_size(archive)
    weights = [r for r in archive.records if r.dtype != "raw"]
    parameters = 0  # learned values: not the permutation indices nor the head manifest
    for record in weights:
        if record.name in NOT_PARAMETERS:
            continue
        count = 1
        for dim in record.shape:
            count *= dim
        parameters += count
    return {
        "path": str(archive.path),
        "file_bytes": archive.size,
        "generation": archive.generation,
        "format": f"needle{archive.generation}",
        "tag": f"0x{tag:08X}",
        "geometry": geometry,
        "tensors": tensors,
        "totals": {
            "records": len(archive.records),
            "parameters": parameters,
            "weight_bytes": sum(r.nbytes for r in weights),
            "cq_records": sum(r.dtype == "cq" for r in weights),
            "cq_bits": sorted({r.bits for r in weights if r.dtype == "cq"}),
        },
        "tokenizer": {
            "vocab_size": vocab_size,
            "source": source,
            "nbytes": archive.records[-1].nbytes,
        },
        "heads": list(archive.heads),
    }


# -- the tables -------------------------------------------------------------------------------
def _format_shape(shape: list[int]) -> str:
    return "[" + ", ".join(str(dim) for dim in shape) + "]"


def _format_bits(entry: dict[str, Any]) -> str:
    if entry["dtype"] == "cq":
        return "ternary" if entry["bits"] == 5 else str(entry["bits"])
    return "" if entry["bits"] is None else str(entry["bits"])


def render(summary: dict[str, Any]) -> None:
    """Pretty tables on stdout (rich)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=120)  # piped: do not squeeze to 80 columns

    console.print(
        f"[bold]{summary['path']}[/]: Needle {summary['generation']} archive "
        f"(tag {summary['tag']}), {summary['file_bytes']:,} bytes"
    )
    geometry = Table(title="Geometry", box=box.SIMPLE, show_header=False, title_justify="left")
    geometry.add_column("field", style="cyan")
    geometry.add_column("value")
    for key, value in summary["geometry"].items():
        shown = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        geometry.add_row(key, shown or "-")
    console.print(geometry)

    tensors = Table(
        title=f"Tensors ({len(summary['tensors'])} records)", box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    tensors.add_column("#", justify="right", style="dim")
    tensors.add_column("name", no_wrap=True)
    tensors.add_column("role")
    tensors.add_column("dtype")
    tensors.add_column("shape", no_wrap=True)
    tensors.add_column("bits", justify="right")
    tensors.add_column("bytes", justify="right")
    for entry in summary["tensors"]:
        tensors.add_row(
            str(entry["index"]), entry["name"], entry["role"], entry["dtype"].upper(),
            _format_shape(entry["shape"]), _format_bits(entry), f"{entry['nbytes']:,}",
        )
    console.print(tensors)

    totals = summary["totals"]
    widths = ", ".join(map(str, totals["cq_bits"])) or "none"
    console.print(
        f"parameters: {totals['parameters']:,} in {totals['weight_bytes']:,} bytes "
        f"({totals['cq_records']} CQ records at {widths} bits)"
    )
    tokenizer = summary["tokenizer"]
    console.print(
        f"tokenizer: {tokenizer['vocab_size']:,} pieces ({tokenizer['nbytes']:,}-byte blob)"
    )
    console.print("heads: " + (", ".join(summary["heads"]) or "none"))
