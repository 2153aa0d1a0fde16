"""Build of needlepoint's native kernels (everything else is in pyproject.toml).

The kernels are one C library (`src/needlepoint/kernels/native/needlepoint_native.c` and the
headers it includes: the exact/pinned kernels, the Needle 3 step, the int8 kernels) built from
source by `pip install -e .` / `pip install .` as an optional extension: where no compiler is
present the build says so and the package still installs and imports, falling back to the
pure-numpy reference kernels (`needlepoint.kernels.exact`) with one warning.
"""

from setuptools import Extension, setup

NATIVE = Extension(
    "needlepoint.kernels.native._needlepoint_native",
    sources=["src/needlepoint/kernels/native/needlepoint_native.c"],
    depends=[f"src/needlepoint/kernels/native/{name}" for name in (
        "np_body.h", "np_v3_block.h", "np_v3_rows.h", "np_v3_types.h", "np_i8.h", "np_i8_body.h",
        "np_i8_rows.h", "np_i8_block.h", "np_cq_int.h", "np_v3_attend.h",
        "np_cq_int4.h")],
    define_macros=[("NP_PYTHON_MODULE", "1")],
    # Exactness contract (docs/numerics.md): no fused or reassociated float operations.
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno"],
    libraries=["m", "pthread"],
    optional=True,
)

setup(ext_modules=[NATIVE])
