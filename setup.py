"""Build the C extension; all metadata lives in pyproject.toml."""

from setuptools import Extension, setup

LIMITED_API = 0x030A0000  # abi3 floor: CPython 3.10

core = Extension(
    "memreclaim._core",
    sources=[
        "src/memreclaim/_core.c",
        "src/memreclaim/procfs.c",
        "src/memreclaim/alloc.c",
    ],
    depends=["src/memreclaim/memreclaim.h"],
    define_macros=[("Py_LIMITED_API", hex(LIMITED_API))],
    py_limited_api=True,
    libraries=["dl"],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra"],
)

setup(
    ext_modules=[core],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
