"""Ops on TensorTuples: make_tuple, tuple_get_item, fused_add_scalars."""

from needle_c import FusedAddScalars, MakeTensorTuple, TupleGetItem  # noqa: F401

from ..autograd import TensorTuple, TensorTupleOp  # noqa: F401


def make_tuple(*args):
    return MakeTensorTuple()(*args)


def tuple_get_item(value, index):
    return TupleGetItem(index)(value)


def fused_add_scalars(x, c0, c1):
    return FusedAddScalars(c0, c1)(x)
