"""Build of needlepoint's native kernels (everything else is in pyproject.toml).

The kernels are one C file (`src/needlepoint/kernels/native/needlepoint_native.c`) built from
source by `pip install -e .` / `pip install .` as an optional extension: where no compiler is
present the build says so and the package still installs and imports, falling back to the
pure-numpy reference kernels (`needlepoint.kernels.exact`) with one warning.
"""

from setuptools import Extension, setup

NATIVE = Extension(
    "needlepoint.kernels.native._needlepoint_native",
    sources=["src/needlepoint/kernels/native/needlepoint_native.c"],
    depends=["src/needlepoint/kernels/native/np_body.h",
             "src/needlepoint/kernels/native/np_cq_int.h",
             "src/needlepoint/kernels/native/np_cq_int4.h"],
    define_macros=[("NP_PYTHON_MODULE", "1")],
    # Exactness contract (docs/numerics.md): no fused or reassociated float operations.
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno"],
    libraries=["m", "pthread"],
    optional=True,
)

# The block-scaled int8 kernels of the transformer models' int8 numerics (kernels/i8.py is
# their numpy reference): a second optional extension, same exactness flags.
I8 = Extension(
    "needlepoint.kernels.i8native._np_i8",
    sources=["src/needlepoint/kernels/i8native/np_i8.c"],
    depends=["src/needlepoint/kernels/i8native/np_i8_body.h",
             "src/needlepoint/kernels/i8native/np_i8_rows.h",
             "src/needlepoint/kernels/i8native/np_i8_block.h"],
    define_macros=[("I8_PYTHON_MODULE", "1")],
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno"],
    libraries=["m", "pthread"],
    optional=True,
)

setup(ext_modules=[NATIVE, I8])
