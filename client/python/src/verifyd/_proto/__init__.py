"""Stubs generated from verify.proto when the package is built (never committed).

`verify_pb2` holds the messages of package verify.v1, `verify_pb2_grpc` the VerifyService
stub. They are written here by the build (setup.py); a source checkout that was not built
has none: install the package (`pip install ./client/python`).
"""
