"""Build the llama.cpp peers from source when missing: `needlepoint-bench-build-peers`.

Two peers, both from llama-cpp-python's sdist (which vendors llama.cpp under
`vendor/llama.cpp`), so the Python binding and the server run the same llama.cpp:

* llama-cpp-python, installed into the running interpreter's environment:
  `pip download --no-deps --no-binary :all: llama-cpp-python==VERSION`, then
  `nice -n 19 pip install SDIST` (its small runtime dependencies, diskcache and jinja2,
  come with it: the binding does not import without them) with
  `CMAKE_BUILD_PARALLEL_LEVEL=1` and the `CMAKE_ARGS` of `PIP_CMAKE_ARGS` (no llava/mtmd,
  tests, examples or tools: the binding needs libllama and libggml only);
* `llama-server`, configured with cmake from the sdist's `vendor/llama.cpp` and built with
  `nice -n 19 cmake --build ... --target llama-server -j 1` into
  `~/.cache/needlepoint-bench/llama-server/` (binary: `build/bin/llama-server`).

Both with `CFLAGS`/`CXXFLAGS` = `AMX_OFF`: ggml builds with `-march=native` (`GGML_NATIVE`),
and on Intel machines that report AMX its AMX kernels crash; the compiler flags remove them
(`GGML_AMX_*=OFF` does not). Harmless where there is no AMX, so they are always passed.
One job, niced: the benchmark machines are shared.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.3.36"  # bench/pyproject.toml's `peers` pin
CACHE = Path.home() / ".cache" / "needlepoint-bench"
AMX_OFF = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
PIP_CMAKE_ARGS = ("-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
                  "-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF")
SERVER_CMAKE_ARGS = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON",
                     "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
                     "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                     "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"]


def build_env() -> dict[str, str]:
    """The environment of both builds: AMX kernels compiled out, one compile job."""
    env = dict(os.environ)
    env.update(CFLAGS=AMX_OFF, CXXFLAGS=AMX_OFF, CMAKE_BUILD_PARALLEL_LEVEL="1")
    return env


def _run(cmd: list[str], log, **kwargs) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kwargs)


def sdist(cache: Path = CACHE, log=print) -> Path:
    """llama-cpp-python's sdist in `cache/sdist`, downloaded once."""
    folder = cache / "sdist"
    found = sorted(folder.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          f"llama-cpp-python=={VERSION}", "-d", str(folder)], log)
    return next(folder.glob(f"llama_cpp_python-{VERSION}.tar.gz"))


def ensure_llama_cpp_python(cache: Path = CACHE, log=print) -> str:
    """Install llama-cpp-python from its sdist unless it imports; returns what was done."""
    if importlib.util.find_spec("llama_cpp") is not None:
        return "llama-cpp-python already installed"
    archive = sdist(cache, log)
    env = dict(build_env(), CMAKE_ARGS=PIP_CMAKE_ARGS)
    _run(["nice", "-n", "19", sys.executable, "-m", "pip", "install", "-v", str(archive)], log,
         env=env)
    return f"built llama-cpp-python {VERSION} from {archive}"


def server_binary(cache: Path = CACHE) -> Path:
    return cache / "llama-server" / "build" / "bin" / "llama-server"


def ensure_llama_server(cache: Path = CACHE, log=print) -> Path:
    """`llama-server` built from the sdist's vendored llama.cpp unless it is already there."""
    binary = server_binary(cache)
    if binary.is_file():
        return binary
    archive = sdist(cache, log)
    src = cache / "llama-server" / f"llama_cpp_python-{VERSION}"
    if not (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        with tarfile.open(archive) as tar:
            tar.extractall(src.parent, filter="data")
    build = cache / "llama-server" / "build"
    env = build_env()
    generator = SERVER_CMAKE_ARGS if shutil.which("ninja") else SERVER_CMAKE_ARGS[2:]
    _run(["cmake", "-S", str(src / "vendor" / "llama.cpp"), "-B", str(build), *generator],
         log, env=env)
    _run(["nice", "-n", "19", "cmake", "--build", str(build), "--target", "llama-server",
          "-j", "1"], log, env=env)
    return binary


def check(cache: Path = CACHE) -> str:
    """What is built, and the commands that build what is not."""
    have_py = importlib.util.find_spec("llama_cpp") is not None
    binary = server_binary(cache)
    src = cache / "llama-server" / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    return "\n".join([
        f"llama-cpp-python: {'installed' if have_py else 'missing'}; built with "
        f"CFLAGS/CXXFLAGS=\"{AMX_OFF}\" CMAKE_BUILD_PARALLEL_LEVEL=1 "
        f"CMAKE_ARGS=\"{PIP_CMAKE_ARGS}\" nice -n 19 pip install "
        f"{cache / 'sdist'}/llama_cpp_python-{VERSION}.tar.gz",
        f"llama-server: {binary if binary.is_file() else 'missing'}; built with "
        f"CFLAGS/CXXFLAGS=\"{AMX_OFF}\" cmake -S {src} -B {binary.parents[1]} "
        + " ".join(SERVER_CMAKE_ARGS)
        + f" && nice -n 19 cmake --build {binary.parents[1]} --target llama-server -j 1"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="needlepoint-bench-build-peers",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--only", choices=("python", "server"), default=None)
    parser.add_argument("--check", action="store_true",
                        help="say which peers are built and how they would be, build nothing")
    args = parser.parse_args(argv)
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    if args.check:
        print(check(args.cache))
        return 0
    if args.only in (None, "python"):
        log(ensure_llama_cpp_python(args.cache, log))
    if args.only in (None, "server"):
        log(f"llama-server: {ensure_llama_server(args.cache, log)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
