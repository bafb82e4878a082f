"""A runtime made to fail its builds, as PyPI's PoCL does on a CPU newer than its LLVM.

Every program built from source for a device whose platform or device name contains ``spec``
starts with an ``#error`` line, which the device's own compiler rejects in its own words
(the platform's version is matched too: "PoCL 3.0"; clconv's probe kernel too, unless ``spare_probe``: then the device builds, and every
convolution kernel fails). Used in-process by tests/test_probe.py, and as a wrapper of a whole
program:

    python tests/failing_builds.py SPEC [--spare-probe] -m MODULE [ARGS...]
"""
import runpy
import sys

import pyopencl as cl

MESSAGE = "clconv test: this runtime is made to fail its builds"


def _breaks(context, spec):
    return any(spec.lower() in name.lower() for d in context.devices for name in (d.name, d.platform.name, d.platform.version))


def install(spec, spare_probe=False, patch=None):
    """Break the builds of the devices ``spec`` names: ``patch(obj, name, value)`` sets
    ``pyopencl.Program.__init__`` (a pytest ``monkeypatch.setattr``, undone after the test;
    default: for good)."""
    original = cl.Program.__init__

    def init(self, arg1, arg2=None, arg3=None):
        if (isinstance(arg1, cl.Context) and isinstance(arg2, str) and _breaks(arg1, spec)
                and not (spare_probe and "void probe(" in arg2)):
            arg2 = f"#error {MESSAGE}\n{arg2}"
        original(self, arg1, arg2, arg3)

    (patch or setattr)(cl.Program, "__init__", init)


def main(argv):
    spec, rest = argv[0], argv[1:]
    spare = rest[:1] == ["--spare-probe"]
    rest = rest[1:] if spare else rest
    if rest[:1] != ["-m"] or len(rest) < 2:
        raise SystemExit(__doc__)
    install(spec, spare)
    sys.argv = [rest[1], *rest[2:]]
    runpy.run_module(rest[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
