/* dtype.c: the element types' sizes and names (engine.h's nd_dtype), the
 * one table every layer reads them from. */
#include "internal.h"

#include <string.h>

static const struct {
    const char *name;
    int64_t size;
} dtype_table[ND_DTYPE_COUNT] = {
    [ND_FLOAT32] = {"float32", 4},
    [ND_FLOAT16] = {"float16", 2},
    [ND_BFLOAT16] = {"bfloat16", 2},
    [ND_FLOAT64] = {"float64", 8},
};

/* PyTorch's other spellings. */
static const struct {
    const char *name;
    nd_dtype dtype;
} dtype_aliases[] = {{"float", ND_FLOAT32}, {"half", ND_FLOAT16}, {"double", ND_FLOAT64}};

int64_t nd_dtype_size(nd_dtype dtype) {
    return (unsigned)dtype < ND_DTYPE_COUNT ? dtype_table[dtype].size : 0;
}

const char *nd_dtype_name(nd_dtype dtype) {
    return (unsigned)dtype < ND_DTYPE_COUNT ? dtype_table[dtype].name : "unknown";
}

nd_status nd_dtype_from_name(const char *name, nd_dtype *out) {
    for (int d = 0; d < ND_DTYPE_COUNT; d++)
        if (strcmp(name, dtype_table[d].name) == 0) {
            *out = (nd_dtype)d;
            return ND_OK;
        }
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++)
        if (strcmp(name, dtype_aliases[i].name) == 0) {
            *out = dtype_aliases[i].dtype;
            return ND_OK;
        }
    return nd_fail(ND_ERR_VALUE,
                   "unknown dtype '%s': expected float32, float16, bfloat16 or float64", name);
}
