/* Every kernel of the library, compiled once per instruction-set variant by
 * needlepoint_native.c (every function name goes through NP_NAME() / NP_NAME(), which append
 * the variant's suffix). One header per kernel family, in dependency order. */
#include "np_a8.h"     /* A8 rows and codes, the integer Walsh-Hadamard */
#include "np_cq.h"     /* exact CQ x A8 products (+ np_cq_int.h, np_cq_int16.h) */
#include "np_exp.h"    /* the pinned exp */
#include "np_attend.h" /* int8 attention */
#include "np_pinned.h" /* pinned float products, dequantised rows, Sinkhorn, Hadamard MLP */
#include "np_v3_block.h" /* the Needle 3 blocks, engram sites and read-out */
#include "np_v3_step.h"  /* all of them in one call */
#include "np_i8_body.h"  /* the transformer int8 kernels */
#include "np_i8_rows.h"
#include "np_wt.h"      /* products over GGUF weight blocks as stored */
