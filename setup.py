"""Package layout and build hook that pyproject.toml cannot express.

The distribution owns ``sglang/jit_kernel/`` and nothing else under ``sglang/``: ``sglang`` is a
PEP 420 namespace here (no ``sglang/__init__.py``), because the ``sglang`` distribution owns that
file, and ``sglang/test/...`` too. The one module of sglang's path that the tutorial imports,
``sglang.test.ci.ci_register``, is shipped under a directory of its own,
``sglang_jit_kernel_compat/`` (holding ``sglang/test/ci/ci_register.py``), which
``sglang_jit_kernel_compat.pth`` appends to ``sys.path`` after site-packages: without sglang it
completes the namespace; beside sglang, whose ``sglang/__init__.py`` makes ``sglang`` a regular
package, sglang's own module answers the import and the directory is never searched. See the
README, "Installing beside sglang".

``package_dir`` maps named packages (not ``""``), so that setuptools' editable install uses its
import finder instead of a ``python/`` entry on ``sys.path``: that finder also serves
``sglang.jit_kernel`` as a submodule of an installed sglang's regular package.
"""

from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

COMPAT = "sglang_jit_kernel_compat"
COMPAT_PACKAGE = f"{COMPAT}.sglang.test.ci"
PTH_NAME = f"{COMPAT}.pth"


class BuildPyWithPth(build_py):
    """``build_py`` that also writes ``sglang_jit_kernel_compat.pth`` at the wheel's top level.

    The file holds one path line (no code): site appends ``<site-packages>/sglang_jit_kernel_compat``
    to ``sys.path``. An editable install does not need it (its finder maps ``python/sglang``, where
    ``test/ci/ci_register.py`` sits), so it is written for regular builds only.
    """

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            Path(self.build_lib, PTH_NAME).write_text(f"{COMPAT}\n")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            outputs.append(str(Path(self.build_lib, PTH_NAME)))
        return outputs


setup(
    package_dir={"sglang": "python/sglang", COMPAT_PACKAGE: "python/sglang/test/ci"},
    packages=[
        "sglang",
        *find_namespace_packages(where="python", include=["sglang.jit_kernel", "sglang.jit_kernel.*"]),
        COMPAT_PACKAGE,
    ],
    cmdclass={"build_py": BuildPyWithPth},
)
