"""Build the Cython allocation core; all metadata lives in pyproject.toml.

`DRACTL_CYTHON_ANNOTATE=1` writes the annotated HTML next to the .pyx, and
`DRACTL_CYTHON_PROFILE=1` builds with line tracing for profilers.
"""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

profile = os.environ.get("DRACTL_CYTHON_PROFILE") == "1"
macros = [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")] if profile else []
directives = {
    "language_level": 3,
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
}
if profile:
    directives.update(profile=True, linetrace=True, binding=True)

setup(
    ext_modules=cythonize(
        [
            Extension("dractl._alloc", ["dractl/_alloc.pyx"], define_macros=macros, extra_compile_args=["-O2"]),
            # The YAML fast path of dractl.model.decode: libyaml events straight into Python values.
            Extension(
                "dractl.model.decode._fastyaml",
                ["dractl/model/decode/_fastyaml.pyx"],
                libraries=["yaml"],
                extra_compile_args=["-O2"],
            ),
        ],
        compiler_directives=directives,
        annotate=os.environ.get("DRACTL_CYTHON_ANNOTATE") == "1",
    )
)
