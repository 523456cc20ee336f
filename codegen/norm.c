/*
** BatchNorm2d: the batch statistics and their evaluation-mode stand-in, the
** normalisation, its gradients and the running-statistics update.
**
** x, y, dx, dy are [N, C, H, W], read as N*C planes of H*W; stats is [3, C]
** (mean, 1/sqrt(var + eps), biased var); dparams is [2, C] (d gamma, d beta).
** The per-channel sums run over N, H, W in double, as reductions (the
** prelude's FOR_EACH_BLOCK): on the C target one thread per channel; on CUDA
** one block of CG_BLOCK threads per reduction, its threads reading consecutive
** positions of the flattened (n, h, w) loop and summed by warp shuffles
** (BLOCK_SUM). A channel alone per block would leave most of the GPU idle
** with few channels (ResNet-18's 64 fill 64 blocks of 264), so on CUDA each
** channel is split into cg_batch_slices() slices of the batch, a block each,
** and the channel's last block to finish combines its slices in order (the
** same sum on any GPU, whichever block is last: cg_slices_combine). With
** --sync-bn the
** statistics are over the global batch: bn_sum, bn_sqdev and bn_finish (at the
** end), and bn_grad_x and the running update count a.global_batch examples.
*/
#include "lower_internal.h"

/* The bn_running_update of stats node `stats` when the kernel that makes the statistics
   does it too (one launch fewer per BatchNorm a step; nothing else in a training
   program reads the running statistics): every one but --sync-bn's (bn_finish's), with
   fusion on (MGC_FUSE). -1: none. */
int cg_fused_running(const Lower *L, int stats)
{
    for (int u = stats + 1; L->dec->fuse && u < L->g->n; u++) {
        const Node *r = &L->g->nodes[u];
        if (r->op == OP_BN_RUNNING && r->in[0] == stats && !r->attr.sync && L->g->nodes[stats].op != OP_BN_FINISH) return u;
    }
    return -1;
}

/* The running update of bn_running_update node `run` for channel c, from stats [3, C] just
   written (running = (1 - momentum) * running + momentum * batch, the variance unbiased, as
   PyTorch); statements at `indent`. */
static const char *running_text(Lower *L, int run, int C, const char *indent)
{
    const Node *n = &L->g->nodes[run];
    const Node *st = &L->g->nodes[n->in[0]];
    int x = st->in[0];   /* bn_stats x, or bn_finish (allreduce (bn_sum x)) */
    if (st->op == OP_BN_FINISH) x = L->g->nodes[L->g->nodes[x].in[0]].in[0];
    const Shape *xs = &L->g->nodes[x].shape;
    return arena_printf(L->p->arena,
                        "%s{   /* running statistics: (1 - momentum) * running + momentum * batch, the variance unbiased */\n"
                        "%s    const float momentum = %s, count = (float)(%s * %dL);\n"
                        "%s    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * stats[c];\n"
                        "%s    float unbiased = count > 1.0f ? stats[%d + c] * count / (count - 1.0f) : stats[%d + c];\n"
                        "%s    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;\n"
                        "%s}\n",
                        indent, indent, cg_f32(L, n->attr.momentum), n->attr.sync ? "a.global_batch" : "N", xs->d[2] * xs->d[3], indent, indent,
                        2 * C, 2 * C, indent, indent);
}

/* A statistics kernel's arguments after stats and its inputs: when it does the running
   update (run >= 0), running_mean and running_var; marks the update done. */
static void running_args(Lower *L, int run, CgArgs *a)
{
    if (run < 0) return;
    const Node *r = &L->g->nodes[run];
    cg_arg(L, a, buf_of(L, r->in[1]), "=running_mean");
    cg_arg(L, a, buf_of(L, r->in[2]), "=running_var");
    L->p->node_buf[run] = buf_of(L, r->in[1]);   /* cg_lower_bn_running: done */
}

/* Channel c's statistics from per-slice ones, (k * C + c) * 2 in double of pd: slice k's
   mean and sum of squared deviations, `count` (C text of k) its values, `slices` (C text)
   of them; combined in slice order by Chan et al.'s pairwise update, so the result does
   not depend on the threads; then the running update (run >= 0). Statements at `in`. */
static const char *stats_combine_text(Lower *L, int id, int C, const char *slices, const char *count, int run, const char *in)
{
    return arena_printf(L->p->arena,
                        "%sdouble cnt = 0, mean = 0, m2 = 0;\n"
                        "%sfor (long k = 0; k < %s; k++) {\n"
                        "%s    const double nk = %s;\n"
                        "%s    if (nk == 0) continue;\n"
                        "%s    const double mk = pd[(k * %d + c) * 2], tot = cnt + nk, delta = mk - mean;\n"
                        "%s    mean += delta * nk / tot;\n"
                        "%s    m2 += pd[(k * %d + c) * 2 + 1] + delta * delta * cnt * nk / tot;\n"
                        "%s    cnt = tot;\n"
                        "%s}\n"
                        "%sconst double var = m2 / cnt;\n"
                        "%sstats[c] = (float)mean;\n"
                        "%sstats[%d + c] = (float)(1.0 / sqrt(var + %s));\n"
                        "%sstats[%d + c] = (float)var;\n"
                        "%s",
                        in, in, slices, in, count, in, in, C, in, in, C, in, in, in, in, in, C, cg_f64(L, L->g->nodes[id].attr.eps), in, 2 * C,
                        run >= 0 ? running_text(L, run, C, in) : "");
}

/* x [N, C, H, W] -> stats [3, C]: mean, 1/sqrt(biased var + eps), biased var */
void cg_lower_bn_stats(Lower *L, int id)
{
    if (cg_stats_by(L->dec, id) >= 0) {   /* summed by its convolution's kernel */
        cg_lower_bn_stats_chunks(L, id);
        return;
    }
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int C = xs->d[1], HW = xs->d[2] * xs->d[3];
    int S = cg_batch_slices(L, C);
    int run = cg_fused_running(L, id);
    if (S > 1) {   /* GPUs, few channels: S slices of the batch per channel, a block each; a channel's last combines them */
        CgArgs in = { 0 };
        cg_arg(L, &in, buf_of(L, n->in[0]), "x");
        cg_arg(L, &in, cg_out_buf(L, id), "=stats");
        running_args(L, run, &in);
        cg_slices_kernel(L, id, "bn_stats_slices", C, S, 4, &in,
                         arena_printf(L->p->arena, "    /* x is [N, %d, %d]; per slice s of the batch (of %d) and channel c, at part[(s * %d + c) * 2]\n"
                                                   "       in double: the slice's mean and its sum of squared deviations from that mean;\n"
                                                   "       then stats [3, %d]: mean, 1/sqrt(biased var + eps), biased var */\n"
                                                   "    double *pd = (double *)part;\n", C, HW, S, C, C));
        cg_body(L, "        double sum = 0.0;\n"
                   "        BLOCK_LOOP2(k, n1 - n0, j, %d) sum += x[((n0 + k) * %d + c) * %dL + j];\n"
                   "        sum = BLOCK_SUM(sum);\n"
                   "        const double mean = n1 > n0 ? sum / ((double)(n1 - n0) * %d) : 0.0;\n"
                   "        double sq = 0.0;\n"
                   "        BLOCK_LOOP2(k, n1 - n0, j, %d) { double d = x[((n0 + k) * %d + c) * %dL + j] - mean; sq += d * d; }\n"
                   "        sq = BLOCK_SUM(sq);\n"
                   "        if (BLOCK_LEADER) { pd[2 * i] = mean; pd[2 * i + 1] = sq; }\n",
                HW, C, HW, HW, HW, C, HW);
        cg_slices_combine(L, S, stats_combine_text(L, id, C, arena_printf(L->p->arena, "%d", S),
                                                   arena_printf(L->p->arena, "(double)(N * (k + 1) / %d - N * k / %d) * %d", S, S, HW),
                                                   run, "            "));
        cg_end_kernel(L);
        return;
    }
    CgArgs a = { 0 };
    cg_arg(L, &a, cg_out_buf(L, id), "=stats");
    cg_arg(L, &a, buf_of(L, n->in[0]), "x");
    running_args(L, run, &a);
    Step *k = cg_kernel_args(L, id, "bn_stats", dimc(C), &a);
    k->heavy = k->blocks = true;
    cg_body(L, "    /* x is [N, %d, %d]: per channel mean, 1/sqrt(biased var + eps), biased var; two passes in double */\n", C, HW);
    cg_body(L, "    FOR_EACH_BLOCK(c, %dL) {\n        const double m = (double)N * %d;\n", C, HW);
    cg_lane_sums(L, "double", "MGC_DLANES", C, HW, 1, (const char *const[]){ "sum" }, "x", "A0 += x[at];");
    cg_body(L, "        const double mean = sum / m;\n");
    cg_lane_sums(L, "double", "MGC_DLANES", C, HW, 1, (const char *const[]){ "sq" }, "x", "double d = x[at] - mean; A0 += d * d;");
    cg_body(L, "        double var = sq / m;\n"
               "        if (BLOCK_LEADER) {\n"
               "            stats[c] = (float)mean;\n"
               "            stats[%d + c] = (float)(1.0 / sqrt(var + %s));\n"
               "            stats[%d + c] = (float)var;\n%s        }\n    }\n",
            C, cg_f64(L, n->attr.eps), 2 * C, run >= 0 ? running_text(L, run, C, "            ") : "");
    cg_end_kernel(L);
}

/* stats [3, C] from per-slice statistics part (stats_combine_text), the kernel named `what`,
   its comment saying what the slices are (`how`): a kernel of C iterations (the
   statistics summed by a chunked convolution, cg_lower_bn_stats_chunks). */
Step *cg_bn_stats_combine(Lower *L, int id, const char *what, int C, int part, const char *slices, const char *count, const char *how)
{
    int run = cg_fused_running(L, id);
    CgArgs a = { 0 };
    cg_arg(L, &a, cg_out_buf(L, id), "=stats");
    cg_arg(L, &a, part, "part");
    running_args(L, run, &a);
    Step *st = cg_kernel_args(L, id, what, dimc(C), &a);
    cg_body(L, "    /* part, per slice and channel: the mean and the sum of squared deviations, in double\n"
               "       (a slice: %s);\n"
               "       stats [3, %d]: mean, 1/sqrt(biased var + eps), biased var (empty slices skipped) */\n"
               "    const double *pd = (const double *)part;\n"
               "    FOR_EACH(c, %dL) {\n"
               "%s"
               "    }\n",
            how, C, C, stats_combine_text(L, id, C, slices, count, run, "        "));
    cg_end_kernel(L);
    return st;
}

/* The statistics of a BatchNorm whose chunked convolution summed them chunk by
   chunk (its kernel's `part`: per chunk and channel the mean and the sum of
   squared deviations, in double): combined in chunk order (Chan et al.'s
   pairwise update), so the result does not depend on the threads. */
void cg_lower_bn_stats_chunks(Lower *L, int id)
{
    int conv = cg_stats_by(L->dec, id);
    ConvGeom G = cg_conv_geom(L->g, conv);
    int C = G.O, NB = cg_conv_form(L->dec, conv) == CONV_WINOGRAD ? cg_winograd_examples(&G) : cg_chunk_examples(&G);
    long P = (long)G.OH * G.OW;
    Arena *a = L->p->arena;
    cg_bn_stats_combine(L, id, "bn_stats_chunks", C, L->part[id], arena_printf(a, "(N + %d) / %d", NB - 1, NB),
                        arena_printf(a, "(double)(N - k * %d < %d ? N - k * %d : %d) * %ld", NB, NB, NB, NB, P),
                        arena_printf(a, "a chunk of %d examples, %ld values a channel, summed by the convolution's kernel", NB, NB * P))->c_only = true;
}

/* running_mean [C], running_var [C] -> stats [3, C], as bn_stats (evaluation mode) */
void cg_lower_bn_eval_stats(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    int c = n->shape.d[1];
    int b[3] = { cg_out_buf(L, id), buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
    cg_kernel(L, id, "bn_eval_stats", dimc(c), 3, b, (const char *const[]){ "=stats", "running_mean", "running_var" });
    cg_body(L, "    FOR_EACH(c, %dL) {\n"
               "        stats[c] = running_mean[c];\n"
               "        stats[%d + c] = 1.0f / sqrtf(running_var[c] + %s);\n"
               "        stats[%d + c] = running_var[c];\n    }\n", c, c, cg_f32(L, n->attr.eps), 2 * c);
    cg_end_kernel(L);
}

/* y = (x - mean) * invstd * gamma + beta, one (n, c) plane per iteration; with a
   max pool fused (cg_pool_of), the pool of each plane just written, into its own buffer */
void cg_lower_bn_apply(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &n->shape;
    int C = xs->d[1], HW = xs->d[2] * xs->d[3];
    int y = cg_out_buf(L, id);
    int pool = cg_pool_of(L->dec, id);
    int act_out = cg_act_beside(L->dec, id);
    int b[6] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[3]), -1 };
    if (pool >= 0) b[5] = cg_out_buf(L, pool);
    if (act_out >= 0) b[5] = cg_out_buf(L, act_out);   /* a pool is fused only after ReLU, in place */
    if (!L->dec->cpu_only && pool < 0) {   /* GPUs: an element per thread (cg_rows_body), the same arithmetic */
        cg_kernel(L, id, "bn_apply", cg_rows_work(dimn(C), HW), act_out >= 0 ? 6 : 5, b,
                  (const char *const[]){ "=y", "x", "stats", "gamma", "beta", "=ya" });
        cg_body(L, "    /* x, y are [N*%d planes, %d]; y = (x - mean) * invstd * gamma + beta; one element per iteration */\n", C, HW);
        cg_rows_body(L, dimn(C), HW, cg_bn_scale_shift_text(L, C, "row"),
                     arena_printf(L->p->arena, "{ long i = row * %d + at; float v = x[i] * scale + shift; %s }", HW,
                                  cg_relu_out(L->dec, id) ? "y[i] = v > 0.0f ? v : 0.0f;   /* fused relu */" : cg_store(L, id, "y", "i", "v")));
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "bn_apply", dimn(C), pool >= 0 || act_out >= 0 ? 6 : 5, b,
              (const char *const[]){ "=y", "x", "stats", "gamma", "beta", act_out >= 0 ? "=ya" : "=py" })->grain = HW;
    cg_body(L, "    /* x, y are [N*%d planes, %d]; y = (x - mean) * invstd * gamma + beta */\n", C, HW);
    cg_body(L, "    FOR_EACH(plane, %s) {\n", cg_work_str(L, dimn(C)));
    cg_bn_scale_shift(L, C);
    if (act_out >= 0)
        cg_body(L, "        const float *xp = x + plane * %d;\n        float *yp = y + plane * %d;\n"
                   "        for (int k = 0; k < %d; k++) { float v = xp[k] * scale + shift; %s }\n",
                HW, HW, HW, cg_store(L, id, "yp", "k", "v"));
    else
    cg_body(L, "        const float *xp = x + plane * %d;\n        float *yp = y + plane * %d;\n"
               "        for (int k = 0; k < %d; k++) %s\n",
            HW, HW, HW,
            cg_relu_out(L->dec, id) ? "{ float v = xp[k] * scale + shift; yp[k] = v > 0.0f ? v : 0.0f; }   /* fused relu */"
            : cg_act(L->dec, id) >= 0 ? arena_printf(L->p->arena, "{ float v = xp[k] * scale + shift; yp[k] = %s; }   /* fused %s */",
                                                     cg_fused_act(L, id, "v"), ir_op_name((Op)cg_act(L->dec, id)))
                                      : "yp[k] = xp[k] * scale + shift;");
    if (pool >= 0) {
        const Node *pn = &L->g->nodes[pool];
        int OH = pn->shape.d[2], OW = pn->shape.d[3];
        cg_body(L, "        float *pp = py + plane * %d;   /* the fused max pool of the plane just written */\n", OH * OW);
        cg_max_pool_plane(L, "yp", "pp", pn->attr.kernel, pn->attr.stride, pn->attr.padding, xs->d[2], xs->d[3], OH, OW, true, 8);
    }
    cg_body(L, "    }\n");
    cg_end_kernel(L);
}

/* dparams [2, C] from part, (k * C + c) * 2 in double: sum(dy * x) and sum(dy) over slice k
   of the batch, `slices` (C text) of them, added in order (`how`, for the comment). */
/* Channel c's d gamma, d beta from per-slice sums, (k * C + c) * 2 in double of pd: sum(dy * x)
   and sum(dy) of slice k of `slices` (C text), added in order. Statements at `in`. */
static const char *grad_params_combine_text(Lower *L, int C, const char *slices, const char *in)
{
    return arena_printf(L->p->arena,
                        "%sdouble dyx = 0, db = 0;\n"
                        "%sfor (long k = 0; k < %s; k++) { dyx += pd[2 * (k * %d + c)]; db += pd[2 * (k * %d + c) + 1]; }\n"
                        "%sdparams[c] = (float)(stats[%d + c] * (dyx - (double)stats[c] * db));\n"
                        "%sdparams[%d + c] = (float)db;\n",
                        in, in, slices, C, C, in, C, in, C);
}

static Step *bn_grad_params_combine(Lower *L, int id, int C, int part, const char *slices, const char *how)
{
    const Node *n = &L->g->nodes[id];
    int b[3] = { cg_out_buf(L, id), part, buf_of(L, n->in[1]) };
    Step *k = cg_kernel(L, id, "bn_grad_params", dimc(C), 3, b, (const char *const[]){ "=dparams", "part", "stats" });
    cg_body(L, "    /* dparams[0] = d gamma = sum(dy * xhat) = invstd * (sum(dy * x) - mean * sum(dy)), dparams[1] = d beta = sum(dy):\n"
               "       %s */\n"
               "    const double *pd = (const double *)part;\n"
               "    FOR_EACH(c, %dL) {\n"
               "%s"
               "    }\n", how, C, grad_params_combine_text(L, C, slices, "        "));
    cg_end_kernel(L);
    return k;
}

/* One element's terms of bn_grad_params' two sums, s += dy * x and d += dy, from the
   element's x and dy (texts); with an activation gradient folded in (cg_bn_grad_act),
   that gradient made from dy first, stored at dg, and summed in dy's place. */
static const char *grad_terms(Lower *L, int id, int C, const char *c, const char *x, const char *dy, const char *dg,
                              const char *s, const char *d)
{
    if (cg_bn_grad_act(L->dec, id) < 0) return arena_printf(L->p->arena, "%s += (double)%s * %s; %s += %s;", s, dy, x, d, dy);
    return arena_printf(L->p->arena, "{ %s %s %s += (double)g_ * %s; %s += g_; }", cg_bn_grad_act_scale(L, C, c),
                        cg_bn_grad_act_text(L, id, x, dy, dg), s, x, d);
}

/* The arguments of bn_grad_params id's kernels beyond x and dy: with a folded activation
   gradient, the statistics (unless the kernel has them), the bn_apply's gamma and beta,
   and the gradient's own buffer. */
static void grad_act_args(Lower *L, int id, CgArgs *a, bool stats)
{
    int ga = cg_bn_grad_act(L->dec, id), b = cg_bn_grad_act_bn(L->dec, id);
    if (ga < 0) return;
    const Node *bn = &L->g->nodes[b];
    if (stats) cg_arg(L, a, buf_of(L, bn->in[1]), "stats");
    cg_arg(L, a, buf_of(L, bn->in[2]), "gamma");
    cg_arg(L, a, buf_of(L, bn->in[3]), "beta");
    cg_arg(L, a, cg_out_buf(L, ga), "=dg");
}

/* C: one plane's (xp, gp: HW floats of x and dy) terms of the two sums, into the lanes
   s_l and d_l the caller declared; with a folded activation gradient, the plane's
   gradient first, stored at dgp and read back by the sums (a loop of its own, with
   channel c's scale and shift before it: one that GCC vectorises), `in` the indent. */
static void plane_sums(Lower *L, int id, int C, int HW, const char *in)
{
    if (cg_bn_grad_act(L->dec, id) >= 0)
        cg_body(L, "%s%s\n"
                   "%sfor (int k = 0; k < %d; k++) { %s }\n"
                   "%sgp = dgp;\n",
                in, cg_bn_grad_act_scale(L, C, "c"), in, HW, cg_bn_grad_act_text(L, id, "xp[k]", "gp[k]", "dgp[k]"), in);
    cg_body(L, "%sint k = 0;\n"
               "%sfor (; k + MGC_DLANES <= %d; k += MGC_DLANES)\n"
               "%s    for (int l = 0; l < MGC_DLANES; l++) { s_l[l] += (double)gp[k + l] * xp[k + l]; d_l[l] += gp[k + l]; }\n"
               "%sfor (; k < %d; k++) { s_l[0] += (double)gp[k] * xp[k]; d_l[0] += gp[k]; }\n",
            in, in, HW, in, in, HW);
}

/* C target, planes of 16 to 64 positions: the sums of each (n, c) plane, read in
   memory order (a channel's planes are C*H*W floats apart: a thread walking one
   channel over the batch jumps through memory), then per channel the sum of its N
   planes' sums, in order: deterministic, whatever the threads. Measured on
   ResNet-18: its 4x4 layers 0.45 -> 0.2 ms each, 7x7 0.4 -> 0.32; the 14x14 stem was
   slower this way (1.2 -> 1.4: memory-bound either way), and the 2x2 and 1x1 planes
   gain nothing (the partial sums outweigh the planes). */
static void grad_params_planes(Lower *L, int id, int C, int HW, int dy, const char *folded)
{
    const Node *n = &L->g->nodes[id];
    bool act = cg_bn_grad_act(L->dec, id) >= 0;
    int part = cg_new_buf(L, BUF_WORK, dimn(4L * C), "BatchNorm gradient partial sums", id);
    CgArgs in = { 0 };
    cg_arg(L, &in, part, "=part");
    cg_arg(L, &in, buf_of(L, n->in[0]), "x");
    cg_arg(L, &in, dy, "dy");
    grad_act_args(L, id, &in, true);
    Step *k1 = cg_kernel_args(L, id, "bn_grad_params_planes", dimn(C), &in);
    k1->grain = HW;
    k1->c_only = true;
    cg_body(L, "    /* per (n, c) plane of [N*%d, %d]: sum(dy * x) and sum(dy), in double%s */\n"
               "    double *pd = (double *)part;\n"
               "    FOR_EACH(plane, %s) {\n"
               "        const float *xp = x + plane * %d, *gp = dy + plane * %d;\n"
               "%s"
               "        double s_l[MGC_DLANES] = { 0 }, d_l[MGC_DLANES] = { 0 };\n",
            C, HW, folded, cg_work_str(L, dimn(C)), HW, HW,
            act ? arena_printf(L->p->arena, "        const long c = plane %% %d;\n        float *dgp = dg + plane * %d;\n", C, HW) : "");
    plane_sums(L, id, C, HW, "        ");
    cg_body(L, "        double s = 0, d = 0;\n"
               "        for (int l = 0; l < MGC_DLANES; l++) s += s_l[l], d += d_l[l];\n"
               "        pd[2 * plane] = s;\n"
               "        pd[2 * plane + 1] = d;\n"
               "    }\n");
    cg_end_kernel(L);
    Step *k2 = bn_grad_params_combine(L, id, C, part, "N", "the planes' sums, added over the batch in order");
    k2->grain = 2;
    k2->c_only = true;
}

/* GPUs, few channels: S slices of the batch per channel, a block each; a channel's last adds them */
static void grad_params_slices(Lower *L, int id, int C, int HW, int S, int dy, const char *folded)
{
    const Node *n = &L->g->nodes[id];
    CgArgs in = { 0 };
    cg_arg(L, &in, buf_of(L, n->in[0]), "x");
    cg_arg(L, &in, dy, "dy");
    cg_arg(L, &in, buf_of(L, n->in[1]), "stats");
    grad_act_args(L, id, &in, false);
    cg_arg(L, &in, cg_out_buf(L, id), "=dparams");
    cg_slices_kernel(L, id, "bn_grad_params_slices", C, S, 4, &in,
                     arena_printf(L->p->arena, "    /* x, dy are [N, %d, %d]; per slice s of the batch (of %d) and channel c, at "
                                               "part[(s * %d + c) * 2]\n"
                                               "       in double: sum(dy * x) and sum(dy); then dparams[0] = d gamma = sum(dy * xhat)\n"
                                               "       = invstd * (sum(dy * x) - mean * sum(dy)), dparams[1] = d beta = sum(dy)%s */\n"
                                               "    double *pd = (double *)part;\n", C, HW, S, C, folded));
    cg_body(L, "        double dyx = 0.0, db = 0.0;\n"
               "        BLOCK_LOOP2(k, n1 - n0, j, %d) { long at = ((n0 + k) * %d + c) * %dL + j; %s }\n"
               "        dyx = BLOCK_SUM(dyx);\n"
               "        db = BLOCK_SUM(db);\n"
               "        if (BLOCK_LEADER) { pd[2 * i] = dyx; pd[2 * i + 1] = db; }\n",
            HW, C, HW, grad_terms(L, id, C, "c", "x[at]", "dy[at]", "dg[at]", "dyx", "db"));
    cg_slices_combine(L, S, grad_params_combine_text(L, C, arena_printf(L->p->arena, "%d", S), "            "));
    cg_end_kernel(L);
}

/* A block per channel: CUDA's threads over its elements, C's thread over its planes
   (with a folded activation gradient, a plane at a time: plane_sums) */
static void grad_params_blocks(Lower *L, int id, int C, int HW, int dy, const char *folded)
{
    const Node *n = &L->g->nodes[id];
    CgArgs in = { 0 };
    cg_arg(L, &in, cg_out_buf(L, id), "=dparams");
    cg_arg(L, &in, buf_of(L, n->in[0]), "x");
    cg_arg(L, &in, buf_of(L, n->in[1]), "stats");
    cg_arg(L, &in, dy, "dy");
    grad_act_args(L, id, &in, false);
    Step *k = cg_kernel_args(L, id, "bn_grad_params", dimc(C), &in);
    k->heavy = k->blocks = true;
    cg_body(L, "    /* dparams[0] = d gamma = sum(dy * xhat), dparams[1] = d beta = sum(dy), over N, H, W%s */\n", folded);
    cg_body(L, "    FOR_EACH_BLOCK(c, %dL) {\n"
               "        const float mean = stats[c], invstd = stats[%d + c];\n", C, C);
    if (cg_bn_grad_act(L->dec, id) >= 0 && L->dec->cpu_only) {
        cg_body(L, "        double s_l[MGC_DLANES] = { 0 }, d_l[MGC_DLANES] = { 0 };\n"
                   "        for (long n = 0; n < N; n++) {\n"
                   "            const float *xp = x + (n * %d + c) * %dL, *gp = dy + (n * %d + c) * %dL;\n"
                   "            float *dgp = dg + (n * %d + c) * %dL;\n"
                   "            if (n + 4 < N) { PREFETCH_ROW(xp + %ldL, %d); PREFETCH_ROW(gp + %ldL, %d); }   /* the planes 4 images on */\n",
                C, HW, C, HW, C, HW, 4L * C * HW, HW, 4L * C * HW, HW);
        plane_sums(L, id, C, HW, "            ");
        cg_body(L, "        }\n"
                   "        double dyx = 0, db = 0;\n"
                   "        for (int l = 0; l < MGC_DLANES; l++) dyx += s_l[l], db += d_l[l];\n");
    } else {   /* d gamma = invstd * (sum(dy * x) - mean * sum(dy)): two plain sums (products exact in double) */
        cg_lane_sums(L, "double", "MGC_DLANES", C, HW, 2, (const char *const[]){ "dyx", "db" }, "x dy",
                     grad_terms(L, id, C, "c", "x[at]", "dy[at]", "dg[at]", "A0", "A1"));
    }
    cg_body(L, "        if (BLOCK_LEADER) {\n"
               "            dparams[c] = (float)(invstd * (dyx - (double)mean * db));\n            dparams[%d + c] = (float)db;\n        }\n    }\n", C);
    cg_end_kernel(L);
}

/* x, stats, dy -> dparams [2, C]: d gamma = sum(dy * xhat), d beta = sum(dy); overwrites.
   With an activation gradient folded in (cg_bn_grad_act), dy is the activation's output
   gradient, and the kernel that reads it stores the activation's input gradient too. */
void cg_lower_bn_grad_params(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &L->g->nodes[n->in[0]].shape;
    int C = xs->d[1], HW = xs->d[2] * xs->d[3];
    int ga = cg_bn_grad_act(L->dec, id);
    int dy = buf_of(L, ga >= 0 ? L->g->nodes[ga].in[1] : n->in[2]);   /* the activation's output gradient, where folded */
    const char *folded = ga >= 0 ? arena_printf(L->p->arena, "; dy through %s's gradient first, stored into dg",
                                                ir_op_name((Op)cg_act(L->dec, cg_bn_grad_act_bn(L->dec, id))))
                                 : "";
    int S = cg_batch_slices(L, C);
    if (L->dec->cpu_only && HW >= 16 && HW <= 64) grad_params_planes(L, id, C, HW, dy, folded);
    else if (S > 1) grad_params_slices(L, id, C, HW, S, dy, folded);
    else grad_params_blocks(L, id, C, HW, dy, folded);
}

/* x, stats, gamma, dy, dparams -> dx (like x); overwrites */
void cg_lower_bn_grad_x(Lower *L, int id)
{
    const Node *n = &L->g->nodes[id];
    const Shape *xs = &n->shape;
    int C = xs->d[1], HW = xs->d[2] * xs->d[3];
    int y = cg_out_buf(L, id);
    int b[6] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[3]), buf_of(L, n->in[4]) };
    if (!L->dec->cpu_only) {   /* GPUs: an element per thread (cg_rows_body), the same arithmetic */
        cg_kernel(L, id, "bn_grad_x", cg_rows_work(dimn(C), HW), 6, b, (const char *const[]){ "=dx", "x", "stats", "gamma", "dy", "dparams" });
        cg_body(L, "    /* dx = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M), M = N*H*W; one element per iteration, planes [N*%d, %d] */\n",
                C, HW);
        cg_body(L, "    const float inv_m = 1.0f / (float)(%s * %dL);\n", n->attr.sync ? "a.global_batch" : "N", HW);
        cg_rows_body(L, dimn(C), HW,
                     arena_printf(L->p->arena, "        long c = row %% %d, i = row * %d + at;\n"
                                               "        float invstd = stats[%d + c], mean = stats[c], k1 = gamma[c] * invstd;\n"
                                               "        float mdb = dparams[%d + c] * inv_m, mdg = dparams[c] * inv_m;\n",
                                  C, HW, C, C),
                     "dx[i] = k1 * (dy[i] - mdb - (x[i] - mean) * invstd * mdg);");
        cg_end_kernel(L);
        return;
    }
    cg_kernel(L, id, "bn_grad_x", dimn(C), 6, b, (const char *const[]){ "=dx", "x", "stats", "gamma", "dy", "dparams" })->grain = HW;
    cg_body(L, "    /* dx = gamma * invstd * (dy - dbeta / M - xhat * dgamma / M), M = N*H*W; planes [N*%d, %d] */\n", C, HW);
    cg_body(L, "    const float inv_m = 1.0f / (float)(%s * %dL);\n"
               "    FOR_EACH(plane, %s) {\n"
               "        long c = plane %% %d;\n"
               "        float invstd = stats[%d + c], mean = stats[c], k1 = gamma[c] * invstd;\n"
               "        float mdb = dparams[%d + c] * inv_m, mdg = dparams[c] * inv_m;\n"
               "        const float *xp = x + plane * %d, *dyp = dy + plane * %d;\n        float *dxp = dx + plane * %d;\n"
               "        for (int k = 0; k < %d; k++) dxp[k] = k1 * (dyp[k] - mdb - (xp[k] - mean) * invstd * mdg);\n    }\n",
            n->attr.sync ? "a.global_batch" : "N", HW, cg_work_str(L, dimn(C)), C, C, C, HW, HW, HW, HW);
    cg_end_kernel(L);
}

/* stats, running_mean, running_var: the running statistics updated in place */
void cg_lower_bn_running(Lower *L, int id)
{
    if (L->p->node_buf[id] >= 0) return;   /* done by its statistics' kernel (cg_fused_running) */
    const Node *n = &L->g->nodes[id];
    int C = L->g->nodes[n->in[0]].shape.d[1];
    int b[3] = { buf_of(L, n->in[1]), buf_of(L, n->in[2]), buf_of(L, n->in[0]) };
    cg_kernel(L, id, "bn_running_update", dimc(C), 3, b, (const char *const[]){ "=running_mean", "=running_var", "stats" });
    cg_body(L, "    FOR_EACH(c, %dL) {\n%s    }\n", C, running_text(L, id, C, "        "));
    cg_end_kernel(L);
    L->p->node_buf[id] = buf_of(L, n->in[1]);
}

/* --sync-bn's statistics: bn_sum and bn_sqdev are this replica's sums over its
   shard; after their allreduces, bn_finish makes [3,C] stats as bn_stats does,
   over the global count (a.global_batch examples). */
void cg_lower_bn_sync(Lower *L, int id)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    int y = cg_out_buf(L, id);
    if (n->op == OP_BN_FINISH) {
        const Shape *xs = &g->nodes[g->nodes[g->nodes[n->in[0]].in[0]].in[0]].shape;   /* allreduce(bn_sum(x)) */
        int C = xs->d[1], HW = xs->d[2] * xs->d[3];
        int b[3] = { y, buf_of(L, n->in[0]), buf_of(L, n->in[1]) };
        cg_kernel(L, id, "bn_finish", dimc(C), 3, b, (const char *const[]){ "=stats", "sum", "sqdev" });
        cg_body(L, "    /* sum, sqdev: over the global batch (every replica's part added); stats as bn_stats */\n");
        cg_body(L, "    const double m = (double)a.global_batch * %d;\n"
                "    FOR_EACH(c, %dL) {\n"
                "        double var = sqdev[c] / m;\n"
                "        stats[c] = (float)(sum[c] / m);\n"
                "        stats[%d + c] = (float)(1.0 / sqrt(var + %s));\n"
                "        stats[%d + c] = (float)var;\n    }\n", HW, C, C, cg_f64(L, n->attr.eps), 2 * C);
        cg_end_kernel(L);
        return;
    }
    const Shape *xs = &g->nodes[n->in[0]].shape;
    int C = xs->d[1], HW = xs->d[2] * xs->d[3];
    bool sq = n->op == OP_BN_SQDEV;
    int b[3] = { y, buf_of(L, n->in[0]), sq ? buf_of(L, n->in[1]) : -1 };
    Step *s = sq ? cg_kernel(L, id, "bn_sqdev", dimc(C), 3, b, (const char *const[]){ "=sqdev", "x", "sum" })
                 : cg_kernel(L, id, "bn_sum", dimc(C), 2, b, (const char *const[]){ "=sum", "x" });
    s->heavy = s->blocks = true;
    cg_body(L, "    /* x is [N, %d, %d], this replica's part of the global batch; in double, as bn_stats */\n", C, HW);
    if (sq) cg_body(L, "    const double m = (double)a.global_batch * %d;\n", HW);
    cg_body(L, "    FOR_EACH_BLOCK(c, %dL) {\n", C);
    if (sq) cg_body(L, "        const double mean = sum[c] / m;\n");
    cg_lane_sums(L, "double", "MGC_DLANES", C, HW, 1, (const char *const[]){ "acc" }, "x", sq ? "double d = x[at] - mean; A0 += d * d;" : "A0 += x[at];");
    cg_body(L, "        if (BLOCK_LEADER) %s[c] = (float)acc;\n    }\n", sq ? "sqdev" : "sum");
    cg_end_kernel(L);
}
