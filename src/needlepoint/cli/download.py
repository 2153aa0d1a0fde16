"""`needlepoint download`: fetch a Needle model from the Hugging Face Hub."""

from __future__ import annotations

import argparse

from ..models.hub import DEFAULT_REPO

HELP = f"download a model from the Hugging Face Hub (default {DEFAULT_REPO}; needs network)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", default=DEFAULT_REPO, help="Hub repository id")
    parser.add_argument("--dir", default=None, help="download into this folder")
    parser.add_argument("--timeout", type=float, default=10.0, help="network timeout, seconds")


def run(args: argparse.Namespace) -> int:
    from ..models.hub import download

    path = download(args.repo, local_dir=args.dir, timeout_s=args.timeout)
    print(path)
    return 0
