"""needle.distributed's collectives by dtype: the dtype table, every collective in every
dtype on two ranks over MPI and on a group of one in process, the dtype mismatches the ranks
must agree on, and the arguments the NCCL backend passes to libnccl (dtype, element count,
the bytes it points at), checked against a stub libnccl compiled here (no GPU needed).
"""

import ctypes
import os
import subprocess
import sysconfig

import numpy as np
import pytest

import needle as ndl
import needle.distributed as dist
import needle_c as _c
from needle.distributed import _dtypes, _nccl

from devices import DEVICES
from mpi_run import launch, needs_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "distributed")
DTYPES = ["float32", "float16", "bfloat16", "float64"]
# ncclDataType_t in nccl.h.
NCCL_ENUM = {"float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}


def host_values(arr):
    """The array's values as NumPy gives them (float32 for bfloat16)."""
    return np.asarray(arr.numpy())


def raw_bytes(arr):
    """The bytes of ``arr``'s elements in row-major order, in its own dtype."""
    row = _dtypes.TABLE[arr.dtype]
    return _dtypes.to_wire(row, host_values(arr)).tobytes()


# ------------------------------------------------------------------ the table


def test_the_table_covers_needles_dtypes():
    assert sorted(_dtypes.TABLE) == sorted([ndl.float32, ndl.float16, ndl.bfloat16, ndl.float64])
    for name, row in _dtypes.TABLE.items():
        assert row.name == name
        assert row.nccl == NCCL_ENUM[name]
        # The wire carries the dtype's bytes: 2 for the narrow ones, never widened.
        assert row.wire.itemsize == ndl.cpu().empty((1,), dtype=name).itemsize
    assert _dtypes.TABLE["float64"].reduce == np.float64  # never narrowed to float32
    assert _dtypes.TABLE["bfloat16"].wire == np.uint16
    for narrow in ("float16", "bfloat16"):
        assert _dtypes.TABLE[narrow].reduce == np.float32


@needs_mpi
def test_the_tables_mpi_types_exist():
    from mpi4py import MPI

    for row in _dtypes.TABLE.values():
        for name, dtype in ((row.mpi, row.wire), (row.reduce_mpi, row.reduce)):
            datatype = getattr(MPI, name)
            assert datatype != MPI.DATATYPE_NULL, name
            assert datatype.Get_size() == dtype.itemsize, name


def test_bfloat16_bits_round_trip_every_pattern():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = _dtypes.bfloat16_values(bits)
    assert values.dtype == np.float32
    np.testing.assert_array_equal(_dtypes.bfloat16_bits(values), bits)
    # needle's bfloat16 arrays agree with the bit layout (NaNs aside, whose payload a
    # conversion may quiet).
    finite = bits[np.isfinite(values)]
    arr = ndl.NDArray(_dtypes.bfloat16_values(finite), dtype="bfloat16")
    np.testing.assert_array_equal(_dtypes.bfloat16_bits(arr.numpy()), finite)
    assert _dtypes.bfloat16_bits(np.array([1.0, -2.0, 0.5], np.float32)).tolist() == [
        0x3F80,
        0xC000,
        0x3F00,
    ]


# ------------------------------------------------------------------ two ranks over MPI


@needs_mpi
@pytest.mark.parametrize("device", DEVICES)
def test_dtypes_two_ranks(device):
    name = "cuda" if device.name == "cuda" else "cpu"
    done, _ = launch(os.path.join(SCRIPTS, "dtypes.py"), name)
    assert done.returncode == 0, done.stdout
    assert "Warning" not in done.stdout, done.stdout
    for dtype in DTYPES:
        assert f"ok {name} {dtype}" in done.stdout, done.stdout
    for check in ("mismatched dtypes", "errors", "ddp dtypes"):
        assert f"ok {check}" in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("done"), done.stdout


@needs_mpi
@pytest.mark.cuda
@pytest.mark.skipif(
    not _c._cuda_simulated(), reason="MPI reads CUDA memory only where it is host memory"
)
def test_dtypes_two_ranks_cuda_aware_on_the_simulator():
    """NEEDLE_DIST_CUDA_AWARE=1: MPI gets float32, float64 (and float16 on the wire) device
    arrays themselves; the simulator's device memory is host memory, which the (not
    CUDA-aware) MPI here can read, so the device-direct staging is checked without a GPU."""
    done, _ = launch(
        os.path.join(SCRIPTS, "dtypes.py"), "cuda", env={"NEEDLE_DIST_CUDA_AWARE": "1"}
    )
    assert done.returncode == 0, done.stdout
    for dtype in DTYPES:
        assert f"ok cuda {dtype}" in done.stdout, done.stdout
    assert "Warning" not in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("done"), done.stdout


@needs_mpi
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_dtypes_one_rank_in_process(device, dtype):
    """A group of one in this process: the staging path keeps every dtype (float64's
    0.1 + 1e-12 comes back as it went, bfloat16's bits too)."""
    values = np.array([[0.1 + 1e-12, -0.0, np.inf], [1.5, np.nan, 3e-5]])
    want = ndl.NDArray(values, dtype=dtype).numpy()
    dist.init_process_group(timeout=30)
    try:
        a = ndl.NDArray(values, device=device, dtype=dtype)
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        assert a.dtype == dtype
        np.testing.assert_array_equal(a.numpy(), want)
        view = ndl.NDArray(values, device=device, dtype=dtype).permute((1, 0))
        dist.broadcast(view, src=0)
        np.testing.assert_array_equal(view.numpy(), want.T)
        assert np.signbit(view.numpy()[1, 0])
        out = [ndl.Tensor(ndl.NDArray(np.zeros((3, 2)), device=device, dtype=dtype), device=device)]
        dist.all_gather(out, view)
        assert out[0].dtype == dtype
        np.testing.assert_array_equal(out[0].numpy(), want.T)
        if dtype == "float64":
            assert a.numpy()[0, 0] == 0.1 + 1e-12
        other = "float32" if dtype != "float32" else "float64"
        with pytest.raises(ValueError, match=f"is {other} of shape"):
            dist.all_gather([ndl.NDArray(np.zeros((3, 2)), device=device, dtype=other)], view)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ NCCL's arguments


@pytest.fixture(scope="module")
def nccl_stub(tmp_path_factory):
    """The stub libnccl (tests/distributed/nccl_stub.c), compiled for this test run."""
    out = tmp_path_factory.mktemp("nccl") / "libnccl_stub.so"
    cc = sysconfig.get_config_var("CC") or "cc"
    source = os.path.join(SCRIPTS, "nccl_stub.c")
    cmd = cc.split() + ["-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC"]
    subprocess.run(cmd + ["-o", str(out), source], check=True)
    return str(out)


class _GroupOfTwo:
    """What the communicator uses of a process group: rank 0 of 2 on the CPU, whose waits
    find the (stub's) stream idle at once."""

    rank, size, nccl, broken = 0, 2, None, None
    device = ndl.cpu()

    def wait(self, request, what, keep=()):
        assert request.Test(), what


@pytest.fixture
def stub_comm(nccl_stub, monkeypatch, tmp_path):
    """A Communicator over the stub (found through NEEDLE_NCCL, as a real libnccl would be),
    its calls logged to a file; returns (communicator, a function reading the log)."""
    log = tmp_path / "calls.log"
    monkeypatch.setenv("NEEDLE_NCCL", nccl_stub)
    monkeypatch.setenv("NEEDLE_NCCL_STUB_LOG", str(log))
    lib, path = _nccl.library()
    assert path == nccl_stub
    handle = ctypes.c_void_p()
    assert lib.ncclCommInitRank(ctypes.byref(handle), 2, _nccl._UniqueId(), 0) == 0
    comm = _nccl.Communicator(_GroupOfTwo(), lib, lib, handle)

    def calls():
        if not log.exists():
            return []
        lines = log.read_text().splitlines()
        log.unlink()
        return [
            dict(f.split("=", 1) for f in ["call=" + line.split()[0]] + line.split()[1:])
            for line in lines
        ]

    yield comm, calls
    comm.destroy()


def _array(dtype, shape=(2, 3), view=False):
    values = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 0.75 - 1.0
    values.flat[0] = 0.1 + 1e-12  # a float64 that a float32 would round
    arr = ndl.NDArray(values, dtype=dtype)
    return arr.permute((1, 0)) if view else arr


@pytest.mark.parametrize("view", [False, True], ids=["compact", "view"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_nccl_calls_pass_the_dtype_and_element_count(stub_comm, dtype, view):
    comm, calls = stub_comm
    arr = _array(dtype, view=view)
    before = raw_bytes(arr)
    for op, code in ((dist.ReduceOp.SUM, "0"), (dist.ReduceOp.AVG, "4")):
        comm.all_reduce(arr, op, "all_reduce").wait()
        (call,) = calls()
        assert call == {
            "call": "ncclAllReduce",
            "dtype": str(NCCL_ENUM[dtype]),
            "count": "6",
            "op": code,
            "bytes": before.hex(),
        }
    comm.broadcast(arr, 1, "broadcast").wait()
    (call,) = calls()
    assert (call["call"], call["dtype"], call["count"], call["root"]) == (
        "ncclBroadcast",
        str(NCCL_ENUM[dtype]),
        "6",
        "1",
    )
    assert call["bytes"] == before.hex()
    # all_gather: the gathered block is in the array's dtype (the stub copies the send
    # buffer into both ranks' slots), and each output gets its slot back.
    outs = [ndl.NDArray(np.full(arr.shape, 7.0), dtype=dtype) for _ in range(2)]
    comm.all_gather(outs, arr, "all_gather").wait()
    (call,) = calls()
    assert (call["call"], call["dtype"], call["count"]) == (
        "ncclAllGather",
        str(NCCL_ENUM[dtype]),
        "6",
    )
    assert call["bytes"] == before.hex()
    for out in outs:
        assert out.dtype == dtype
        np.testing.assert_array_equal(out.numpy(), host_values(arr))
    # The data survived the calls unchanged (the stub reduces nothing on one process).
    assert raw_bytes(arr) == before


@pytest.mark.parametrize("dtype", DTYPES)
def test_nccl_empty_arrays_call_nothing(stub_comm, dtype):
    comm, calls = stub_comm
    empty = ndl.NDArray(np.zeros((0, 3)), dtype=dtype)
    comm.all_reduce(empty, dist.ReduceOp.SUM, "all_reduce").wait()
    comm.broadcast(empty, 0, "broadcast").wait()
    assert calls() == []


def test_nccl_refuses_an_array_off_the_groups_device(stub_comm):
    comm, calls = stub_comm
    if ndl.cuda.unavailable_reason() is not None:
        pytest.skip("needs a second device kind: " + ndl.cuda.unavailable_reason())
    arr = ndl.NDArray(np.ones(3), device=ndl.cuda(), dtype="float16")
    with pytest.raises(dist.DistributedError, match="the NCCL group of this rank is on"):
        comm.all_reduce(arr, dist.ReduceOp.SUM, "all_reduce")
    assert calls() == []


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_data_pointer_is_the_first_element(device, dtype):
    """_nccl.data_pointer (from DLPack, which has bfloat16) reads the first element's address,
    offsets of views included; checked against the bytes at that address on the CPU and
    against the CUDA array interface where it has the dtype."""
    base = ndl.NDArray(np.arange(12.0).reshape(3, 4) / 8, device=device, dtype=dtype)
    view = base[1:, 2:]
    for arr in (base, view):
        ptr = _nccl.data_pointer(arr).value
        if dtype != "bfloat16":
            key = "__cuda_array_interface__" if device.name == "cuda" else "__array_interface__"
            assert ptr == getattr(arr, key)["data"][0]
        if device.name == "cpu":
            itemsize = _dtypes.TABLE[dtype].wire.itemsize
            first = ctypes.string_at(ptr, itemsize)
            assert first == raw_bytes(arr)[:itemsize]


def test_ddp_all_reduce_runs_on_the_side_stream_between_events(stub_comm):
    """DistributedDataParallel's bucket all-reduce: on the communicator's own non-blocking
    stream, after an event recorded on needle's stream (0), with an event after it that the
    work's wait makes stream 0 wait for, on the device: the host never waits for it."""
    comm, calls = stub_comm
    arr = _array("float32")
    work = comm.all_reduce(arr, dist.ReduceOp.SUM, "DistributedDataParallel", side_stream=True)
    log = calls()
    assert [c["call"] for c in log] == [
        "cuStreamCreate",
        "cuEventCreate",
        "cuEventRecord",
        "cuStreamWaitEvent",
        "cuEventDestroy",
        "ncclAllReduce",
        "cuEventCreate",
        "cuEventRecord",
    ]
    side, ready = log[0]["stream"], log[1]["event"]
    assert log[0]["flags"] == "1" and side != "0"  # CU_STREAM_NON_BLOCKING
    assert log[1]["flags"] == "2"  # CU_EVENT_DISABLE_TIMING
    assert log[2] == {"call": "cuEventRecord", "event": ready, "stream": "0"}
    assert log[3] == {"call": "cuStreamWaitEvent", "stream": side, "event": ready, "flags": "0"}
    assert (log[5]["stream"], log[5]["count"], log[5]["op"]) == (side, "6", "0")
    done = log[6]["event"]
    assert done != ready and log[7] == {"call": "cuEventRecord", "event": done, "stream": side}
    work.wait()
    assert calls() == [
        {"call": "cuStreamWaitEvent", "stream": "0", "event": done, "flags": "0"},
        {"call": "cuEventDestroy", "event": done},
    ]
    # the stream is made once; a plain all_reduce stays on stream 0
    comm.all_reduce(arr, dist.ReduceOp.SUM, "DistributedDataParallel", side_stream=True).wait()
    assert "cuStreamCreate" not in [c["call"] for c in calls()]
    comm.all_reduce(arr, dist.ReduceOp.SUM, "all_reduce").wait()
    (call,) = calls()
    assert call["call"] == "ncclAllReduce" and "stream" not in call


def test_collectives_queue_on_needles_current_stream(stub_comm):
    """On a GPU the collectives go to needle's current stream (non-blocking: the legacy
    stream, 0, would order nothing against its kernels), and a side-stream all-reduce is
    fenced by events on it. The stub reads the simulated GPU's memory, which is host memory."""
    if not (ndl.cuda().enabled() and __import__("needle_c")._cuda_simulated()):
        pytest.skip("needs the CUDA simulator (its device memory is host memory)")
    comm, calls = stub_comm
    comm.pg = type("GroupOnCuda", (_GroupOfTwo,), {"device": ndl.cuda()})()
    mine = str(ndl.cuda.current_stream().cuda_stream)
    arr = ndl.NDArray(np.arange(6.0).reshape(2, 3), device=ndl.cuda())
    comm.all_reduce(arr, dist.ReduceOp.SUM, "all_reduce").wait()
    comm.broadcast(arr, 0, "broadcast").wait()
    log = calls()
    assert [(c["call"], c.get("stream")) for c in log] == [
        ("ncclAllReduce", mine),
        ("ncclBroadcast", mine),
    ]
    work = comm.all_reduce(arr, dist.ReduceOp.SUM, "DistributedDataParallel", side_stream=True)
    log = calls()
    assert log[2] == {"call": "cuEventRecord", "event": log[1]["event"], "stream": mine}
    work.wait()
    assert calls()[0]["stream"] == mine  # needle's stream waits for the side stream
    side = ndl.cuda.Stream()
    with ndl.cuda.stream(side):  # the current stream is whatever the thread chose
        comm.all_reduce(arr, dist.ReduceOp.SUM, "all_reduce").wait()
    assert calls()[0]["stream"] == str(side.cuda_stream)
