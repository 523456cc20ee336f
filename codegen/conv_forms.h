/*
** The convolution forms, as codegen/conv.c's dispatch calls them: each
** form's forward and two gradients (conv_direct.c, conv_vector.c,
** conv_gemm.c, conv_chunked.c, winograd.c). conv.c chooses a form per layer
** (cg_choose_convs) and lowers through the table of forms; what the forms
** share is conv_common.c's (declared in lower_internal.h), and a form's
** file calls no other form.
*/
#ifndef MGC_CONV_FORMS_H
#define MGC_CONV_FORMS_H
#include "lower_internal.h"

/* A form's lowerings of conv2d, conv2d_grad_x and conv2d_grad_w. */
typedef void (*ConvLowering)(Lower *L, int id, const ConvGeom *G);
typedef struct ConvForm {
    ConvLowering forward, grad_x, grad_w;
} ConvForm;

/* conv_direct.c: CONV_DIRECT (loops over planes; rows_vec and depthwise variants) */
void cg_conv_direct_forward(Lower *L, int id, const ConvGeom *G);
void cg_conv_direct_grad_x(Lower *L, int id, const ConvGeom *G);
void cg_conv_direct_grad_w(Lower *L, int id, const ConvGeom *G);
/* conv_direct_gpu.c: the direct form on GPUs (an element a thread; the weight gradient a block a weight) */
void cg_conv_direct_gpu_forward(Lower *L, int id, const ConvGeom *G, const int *b, bool bias);
void cg_conv_direct_gpu_grad_x(Lower *L, int id, const ConvGeom *G, const int *b);
void cg_conv_direct_gpu_grad_w(Lower *L, int id, const ConvGeom *G, const int *b);
/* whether a layer takes the direct form's depthwise kernels, and its rows_vec variant (pairs: two
   rows at a time, for a fused 2x2 max pool): C only, where cpu_only */
bool cg_conv_depthwise_fits(bool cpu_only, const ConvGeom *G);
bool cg_conv_rows_vec_fits(bool cpu_only, const ConvGeom *G, bool pairs);
/* the weight gradient that routes a fused 2x2 max pool's gradient (cg_wgrad_pool), any form */
void cg_conv_pooled_grad_w(Lower *L, int id, const ConvGeom *G);
/* conv_vector.c: CONV_VECTOR (its input gradient is conv_gemm.c's, channels last) */
void cg_conv_vector_forward(Lower *L, int id, const ConvGeom *G);
void cg_conv_vector_grad_x(Lower *L, int id, const ConvGeom *G);
void cg_conv_vector_grad_w(Lower *L, int id, const ConvGeom *G);
/* conv_gemm.c: CONV_GEMM and CONV_DENSE, and the packing they share */
void cg_conv_gemm_forward(Lower *L, int id, const ConvGeom *G);
void cg_conv_gemm_grad_x(Lower *L, int id, const ConvGeom *G);
void cg_conv_gemm_grad_w(Lower *L, int id, const ConvGeom *G);
void cg_conv_dense_forward(Lower *L, int id, const ConvGeom *G);
void cg_conv_dense_grad_x(Lower *L, int id, const ConvGeom *G);
void cg_conv_dense_grad_w(Lower *L, int id, const ConvGeom *G);

#endif
