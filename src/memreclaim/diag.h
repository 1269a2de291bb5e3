/* The diagnosis engine's readers (memreclaim.diagnosis), in C.
 *
 * diag.c adds its functions to memreclaim._core through mr_diag_methods (module exec calls
 * PyModule_AddFunctions with it). They return raw numbers (ints, tuples) and None where the
 * allocator serving malloc does not offer the figure; every judgement stays in Python.
 */
#ifndef MEMRECLAIM_DIAG_H
#define MEMRECLAIM_DIAG_H

#include "memreclaim.h"

extern PyMethodDef mr_diag_methods[];

#endif /* MEMRECLAIM_DIAG_H */
