"""Python client of echokv-server (gRPC service echokv.v1.EchoKV).

Runs on Debian's python3-grpcio and python3-protobuf (use /usr/bin/python3) over the
stubs the build generates into <build>/python/; put that folder on sys.path, or set
$ECHOKV_PYTHON_STUBS to it, before importing::

    import sys; sys.path[:0] = ["build/python", "client/python"]
    from echokv_client import EchoKVClient

    with EchoKVClient("localhost:50051") as client:
        session = client.create(text="Once upon a time", policy="echokv", budget=64)
        for delta in client.generate(session.id, max_tokens=32):
            print(delta, end="", flush=True)
        print(client.inspect(session.id).total_retained_entries)
"""

from echokv_client.client import EchoKVClient, EchoKVError, Generation

__all__ = ["EchoKVClient", "EchoKVError", "Generation"]
