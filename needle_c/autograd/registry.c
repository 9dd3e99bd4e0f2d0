/* registry.c: the registry of needle's live graph objects: every Value
 * (Tensor, TensorTuple, subclasses) and every Op is on one of two intrusive
 * doubly linked lists (runtime.h's needle_rt.autograd.values / .ops, through
 * the needle_link field of its layout), so that memory/scoped.c can run a
 * cycle collection over needle's objects alone.
 *
 * An object is linked in value_alloc / op_new / op_new_builtin once its
 * fields are valid, which every construction goes through (a Python
 * subclass's tp_new included), and unlinked first thing in its dealloc,
 * before weakref callbacks or the trashcan can run code. O(1) both ways, no
 * allocation, no Python. On free-threaded builds nothing is linked (the lists
 * would need locking; the scoped collection refuses there).
 */
#include "tensor.h"

static void link_insert(needle_link *head, needle_link *l) {
#ifndef Py_GIL_DISABLED
    l->next = head->next;
    l->prev = head;
    l->frozen = 0; /* made after the freezes seen so far (memory/scoped.c) */
    head->next->prev = l;
    head->next = l;
    needle_rt.autograd.linked++;
#else
    (void)head;
    (void)l;
#endif
}

static void link_remove(needle_link *l) {
    if (l->prev == NULL) return;
    l->prev->next = l->next;
    l->next->prev = l->prev;
    l->prev = l->next = NULL;
    needle_rt.autograd.linked--;
}

void registry_link_value(PyObject *value) {
    link_insert(&needle_rt.autograd.values, &Tensor_CAST(value)->link);
}
void registry_unlink_value(PyObject *value) { link_remove(&Tensor_CAST(value)->link); }
void registry_link_op(PyObject *op) { link_insert(&needle_rt.autograd.ops, &Op_CAST(op)->link); }
void registry_unlink_op(PyObject *op) { link_remove(&Op_CAST(op)->link); }
