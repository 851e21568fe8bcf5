"""Stand-in for ansible-test's pip bootstrap script (get-pip-<version>.py).

ansible-test --venv downloads that script from ci-files.testing.ansible.com, which this
machine cannot reach. This does what it does with the pip wheel from the package index
(run.sh downloads it beside this file): install the requested packages with pip run
from the wheel. get-pip's own options (--no-setuptools, --no-wheel) are dropped: this
never adds setuptools or wheel.
"""
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OWN_OPTIONS = {"--no-setuptools", "--no-wheel"}


def main():
    wheels = sorted(glob.glob(os.path.join(HERE, "pip-*-py3-none-any.whl")))
    if not wheels:
        sys.exit("get_pip stand-in: no pip wheel beside %s" % __file__)
    sys.path.insert(0, wheels[-1])
    from pip._internal.cli.main import main as pip_main  # pylint: disable=import-outside-toplevel

    args = [a for a in sys.argv[1:] if a not in OWN_OPTIONS]
    sys.exit(pip_main(["install", "--upgrade", "--force-reinstall"] + args))


if __name__ == "__main__":
    main()
