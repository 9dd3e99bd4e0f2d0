/* A stub libnccl (and the CUDA driver calls _nccl.py makes) for tests/test_collectives_dtypes.py:
 * it exports what needle/distributed/_nccl.py calls, with NCCL's signatures (nccl.h), and
 * records each collective's arguments, so that the dtype and count needle passes are checked
 * without a GPU. The buffers are host memory here.
 *
 * Each collective appends one line to the file named by NEEDLE_NCCL_STUB_LOG:
 *   <call> dtype=<ncclDataType_t> count=<elements> [op=<op>] [root=<root>] bytes=<hex>
 * where <hex> is the send buffer's count * size(dtype) bytes, so the test sees exactly the
 * memory NCCL would read. A dtype outside nccl.h's enum is ncclInvalidArgument, logged.
 * Collectives on one process: all_gather copies the send buffer into every rank's slot of
 * the receive buffer; all_reduce and broadcast leave the data as it is (one rank's sum).
 * Any collective queued on a stream other than NULL adds stream=<handle>. The driver's
 * stream and event calls (the side stream of DistributedDataParallel's all-reduces) append
 *   <call> [flags=<flags>] [stream=<handle>] [event=<handle>]
 * with small integer handles (streams from 0x5000, events from 0x6000; NULL is 0). */

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    ncclSuccess = 0,
    ncclInvalidArgument = 4,
} ncclResult_t;

/* ncclDataType_t's values (nccl.h): int8 0, uint8 1, int32 2, uint32 3, int64 4, uint64 5,
 * float16 6, float32 7, float64 8, bfloat16 9. */
static const size_t dtype_size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
#define DTYPE_COUNT ((int)(sizeof dtype_size / sizeof dtype_size[0]))

typedef struct {
    char internal[128];
} ncclUniqueId;

typedef struct {
    int nranks;
    int rank;
} stub_comm;

typedef stub_comm *ncclComm_t;

/* Appends one record; bytes are dumped only for a known dtype. */
static void record(const char *call, int dtype, size_t count, const char *extra, const void *buf) {
    const char *path = getenv("NEEDLE_NCCL_STUB_LOG");
    if (path == NULL) return;
    FILE *f = fopen(path, "a");
    if (f == NULL) return;
    fprintf(f, "%s dtype=%d count=%zu%s bytes=", call, dtype, count, extra);
    if (dtype >= 0 && dtype < DTYPE_COUNT) {
        const unsigned char *p = buf;
        for (size_t i = 0; i < count * dtype_size[dtype]; i++) fprintf(f, "%02x", p[i]);
    }
    fputc('\n', f);
    fclose(f);
}

static int known(int dtype) { return dtype >= 0 && dtype < DTYPE_COUNT; }

const char *ncclGetErrorString(ncclResult_t result) {
    return result == ncclSuccess ? "no error" : "invalid argument (stub)";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    stub_comm *c = malloc(sizeof *c);
    if (c == NULL || nranks < 1 || rank < 0 || rank >= nranks) {
        free(c);
        return ncclInvalidArgument;
    }
    c->nranks = nranks;
    c->rank = rank;
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *error) {
    (void)comm;
    *error = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op,
                           ncclComm_t comm, void *stream) {
    (void)comm;
    char extra[64];
    if (stream == NULL) snprintf(extra, sizeof extra, " op=%d", op);
    else snprintf(extra, sizeof extra, " op=%d stream=%zu", op, (size_t)stream);
    record("ncclAllReduce", datatype, count, extra, sendbuff);
    if (!known(datatype)) return ncclInvalidArgument;
    if (recvbuff != sendbuff) memcpy(recvbuff, sendbuff, count * dtype_size[datatype]);
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, int datatype,
                           int root, ncclComm_t comm, void *stream) {
    (void)comm;
    char extra[64];
    if (stream == NULL) snprintf(extra, sizeof extra, " root=%d", root);
    else snprintf(extra, sizeof extra, " root=%d stream=%zu", root, (size_t)stream);
    record("ncclBroadcast", datatype, count, extra, sendbuff);
    if (!known(datatype)) return ncclInvalidArgument;
    if (recvbuff != sendbuff) memcpy(recvbuff, sendbuff, count * dtype_size[datatype]);
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, int datatype,
                           ncclComm_t comm, void *stream) {
    char extra[48] = "";
    if (stream != NULL) snprintf(extra, sizeof extra, " stream=%zu", (size_t)stream);
    record("ncclAllGather", datatype, sendcount, extra, sendbuff);
    if (!known(datatype)) return ncclInvalidArgument;
    size_t bytes = sendcount * dtype_size[datatype];
    for (int r = 0; r < comm->nranks; r++)
        memcpy((char *)recvbuff + (size_t)r * bytes, sendbuff, bytes);
    return ncclSuccess;
}

/* The driver call a wait makes (_nccl._StreamRequest): the stream is always idle here. */
int cuStreamQuery(void *stream) {
    (void)stream;
    return 0;
}

/* The side stream's calls: handles are counters, the work is done already (host memory). */
static void record_driver(const char *line) {
    const char *path = getenv("NEEDLE_NCCL_STUB_LOG");
    if (path == NULL) return;
    FILE *f = fopen(path, "a");
    if (f == NULL) return;
    fprintf(f, "%s\n", line);
    fclose(f);
}

static size_t streams_made = 0, events_made = 0;

int cuStreamCreate(void **stream, unsigned flags) {
    *stream = (void *)(0x5000 + streams_made++);
    char line[96];
    snprintf(line, sizeof line, "cuStreamCreate flags=%u stream=%zu", flags, (size_t)*stream);
    record_driver(line);
    return 0;
}

int cuStreamDestroy(void *stream) {
    char line[96];
    snprintf(line, sizeof line, "cuStreamDestroy stream=%zu", (size_t)stream);
    record_driver(line);
    return 0;
}

int cuEventCreate(void **event, unsigned flags) {
    *event = (void *)(0x6000 + events_made++);
    char line[96];
    snprintf(line, sizeof line, "cuEventCreate flags=%u event=%zu", flags, (size_t)*event);
    record_driver(line);
    return 0;
}

int cuEventRecord(void *event, void *stream) {
    char line[96];
    snprintf(line, sizeof line, "cuEventRecord event=%zu stream=%zu", (size_t)event,
             (size_t)stream);
    record_driver(line);
    return 0;
}

int cuStreamWaitEvent(void *stream, void *event, unsigned flags) {
    char line[96];
    snprintf(line, sizeof line, "cuStreamWaitEvent stream=%zu event=%zu flags=%u", (size_t)stream,
             (size_t)event, flags);
    record_driver(line);
    return 0;
}

int cuEventDestroy(void *event) {
    char line[96];
    snprintf(line, sizeof line, "cuEventDestroy event=%zu", (size_t)event);
    record_driver(line);
    return 0;
}
