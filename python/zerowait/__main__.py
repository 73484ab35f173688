"""`python -m zerowait ARGS` and the `zerowait` command of a pip install: both replace this
process with the native command that lies inside the package (``_bin/zerowait``, beside the
shared libraries a wheel vendors in ``zerowait.libs``).

This file imports nothing from the zerowait package: the `zerowait` script runs it without
importing the package, whose numpy and extension would cost every command a third of a second.
"""

import os
import sys

# The native command runs the subcommands that live in Python (emulate, bench net, ...) in the
# interpreter this names: the one this package is installed for (cli/python_module.cpp).
INTERPRETER_VARIABLE = "ZEROWAIT_LAUNCHER_PYTHON"


def main() -> None:
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "zerowait")
    if not os.access(binary, os.X_OK):
        sys.exit(f"zerowait: the native command is missing or not executable at {binary}; "
                 "reinstall the wheel (pip install --force-reinstall zerowait-*.whl)")
    os.environ[INTERPRETER_VARIABLE] = sys.executable
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, ["zerowait", *sys.argv[1:]])


if __name__ == "__main__":
    main()
