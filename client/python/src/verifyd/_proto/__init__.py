"""Stubs of verify.proto (package verify.v1), shipped with the package.

`verify_pb2` holds the messages, `verify_pb2_grpc` the VerifyService stub. They are made by
scripts/regen_stubs.sh with a pinned generator (grpcio-tools 1.51.3), whose code imports with
every protobuf and grpcio release the package allows; never edit them by hand. The test
tests/test_stubs.py fails when they no longer match proto/verify/v1/verify.proto.
"""
