#!/usr/bin/python3
"""`pip install` of the echokv client, offline, into a fresh virtual environment that
sees Debian's packages (python3-grpcio, python3-protobuf, python3-setuptools,
python3-wheel), then a call with the installed package:

    /usr/bin/python3 -m venv --system-site-packages VENV
    VENV/bin/python -m pip install --no-index --no-build-isolation ./client/python

--no-index: pip never contacts an index (the dependencies grpcio and protobuf are
already satisfied by Debian's packages, which the venv sees); --no-build-isolation:
setuptools and wheel come from Debian too instead of being downloaded into a build
environment. Also builds a wheel the same way and checks what it holds.

    /usr/bin/python3 tests/client/python/pip_install_test.py --client client/python
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))

# Run with the installed package: a fake server (whose stubs also come from the
# installed package) and one call of each client kind against it.
CALL = r"""
import asyncio, os, sys
import echokv
from echokv.v1 import echokv_pb2
assert echokv.__file__.startswith(sys.prefix), (echokv.__file__, sys.prefix)
assert echokv_pb2.__file__.startswith(sys.prefix)
sys.path.append(sys.argv[1])  # fake_server.py only (it imports echokv: the installed one)
from fake_server import FakeReplica
fake = FakeReplica(name="echokv-0").start()
with echokv.Client(fake.address) as client:
    assert client.health() == "SERVING"
    session = client.create("hello", budget=4)
    result = client.generate(session.id, max_tokens=3, commit=True).collect()
    assert result.session.tokens_seen == 8, result
async def run():
    async with echokv.AsyncClient(fake.address) as client:
        return (await client.info()).replica_id
assert asyncio.run(run()) == "echokv-0"
fake.stop()
print("installed echokv", echokv.__version__, "at", os.path.dirname(echokv.__file__))
"""


def run(command, **kwargs):
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, **kwargs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", required=True, help="client/python")
    args = parser.parse_args()
    # An environment that cannot reach an index even if a flag were missing, and
    # ignores any pip configuration of the machine.
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_INDEX_URL="http://127.0.0.1:9/",
               PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="echokv-pip-") as tmp:
        # A copy of the source, so setuptools' in-tree build/ and egg-info stay out of
        # the checkout (and parallel runs do not collide).
        source = os.path.join(tmp, "src")
        shutil.copytree(args.client, source, ignore=shutil.ignore_patterns(
            "build", "dist", "*.egg-info", "__pycache__", "*.pyc"))
        venv = os.path.join(tmp, "venv")
        run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], env=env)
        python = os.path.join(venv, "bin", "python")
        run([python, "-m", "pip", "install", "--no-index", "--no-build-isolation", source],
            env=env, cwd=tmp)
        # Import and call from a folder where no source copy is importable.
        run([python, "-c", CALL, HERE], env=env, cwd=venv)
        listing = subprocess.run([python, "-m", "pip", "show", "-f", "echokv"], env=env,
                                 check=True, capture_output=True, text=True).stdout
        for expected in ("echokv/v1/echokv_pb2.py", "echokv/v1/echokv_pb2_grpc.py",
                         "echokv/grpc_health/v1/health_pb2.py",
                         "echokv/grpc_health/v1/health_pb2_grpc.py", "echokv/memory.py"):
            if expected not in listing:
                raise AssertionError("pip show -f echokv lacks %s:\n%s" % (expected, listing))
        if "health_pb2.py" in listing.replace("echokv/grpc_health/v1/health_pb2.py", ""):
            raise AssertionError("a top-level health_pb2 module was installed:\n" + listing)

        # The same offline build as a wheel (what a Debian packaging step would use).
        dist = os.path.join(tmp, "dist")
        run(["/usr/bin/python3", "-m", "pip", "wheel", "--no-index", "--no-build-isolation",
             "--no-deps", "-w", dist, source], env=env, cwd=tmp)
        wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
        if len(wheels) != 1 or not wheels[0].startswith("echokv-0.1.0-py3-none-any"):
            raise AssertionError("expected one pure-Python echokv wheel, got %s" % wheels)
        with zipfile.ZipFile(os.path.join(dist, wheels[0])) as wheel:
            names = set(wheel.namelist())
        for expected in ("echokv/__init__.py", "echokv/v1/echokv_pb2.py",
                         "echokv/grpc_health/v1/health_pb2_grpc.py"):
            if expected not in names:
                raise AssertionError("the wheel lacks %s: %s" % (expected, sorted(names)))
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
