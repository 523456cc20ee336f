/*
** Data parallelism in the generated program.
**
** Gradient buckets (ir/dp.c): each bucket is one buffer, its gradients views
** into it at their offsets, so one collective sums them all; the bucket's
** allreduce step comes right after the node that completes it, and its wait
** right before the first step that reads a sum (see cg_dp_prepare). An
** allreduce on its own (--sync-bn's sums) is a copy into a buffer of its own,
** summed and waited at once. Alone, the executor skips collectives.
**
** --accumulate K (buckets even on one replica): right before a bucket's
** collective, a kernel adds the bucket's gradients across the K micro-batches
** of a step in a buffer of its own (kept from run to run), by the mode the
** host sets (Program.accumulate): the first micro-batch copies them there,
** the middle ones add, the last adds that sum into the bucket, which then is
** summed across replicas and applied as ever. The executor skips the
** collectives and the updates of every micro-batch but the last.
**
** --shard-update (ZeRO-1): a bucket's collective is a reduce-scatter, after
** which each of the R replicas holds the sum of its chunk of the bucket (equal
** chunks of ceil(floats / R), the bucket padded with zeros to R of them; the
** chunk KArgs.replica names, runtime/comm.h). The bucket's parameters live side
** by side in one block laid out as the bucket (Buf.pack), so one kernel a
** bucket updates the replica's chunk of them, with the optimizer state of that
** chunk alone (a buffer of the largest chunk: 1/N of the state), and an
** all-gather of the block, started at once and waited at the end of the step,
** brings every replica the others' chunks. Replicas in one memory share the
** block instead (train.c), each updating its chunk in place, the all-gather
** then only a barrier: that needs every read of a bucket's parameters in a step
** to come before a reduce-scatter whose end the bucket's update waits for
** (reads_covered adds that wait where needed; Program.packs_shareable says
** whether it held). The stop votes get a sum of their own. Updates whose
** gradients are in no bucket (--sync-bn's BatchNorm) stay whole on every
** replica.
*/
#include "lower_internal.h"
#include <stdlib.h>
#include <string.h>


static int new_coll(Lower *L, int src, int dst, long floats, const char *what)
{
    Program *p = L->p;
    p->colls = arena_grow(p->arena, p->colls, sizeof(Collective) * (size_t)p->ncolls, sizeof(Collective) * (size_t)(p->ncolls + 1));
    p->colls[p->ncolls] = (Collective){ src, dst, floats, what, COLL_ALLREDUCE };
    return p->ncolls++;
}

static void coll_step(Lower *L, StepKind kind, int node, int coll) { cg_new_step(L, kind, node)->coll = coll; }

static int view_base(const Graph *g, int id)
{
    while (g->nodes[id].op == OP_SLICE || g->nodes[id].op == OP_RESHAPE) id = g->nodes[id].in[0];
    return id;
}

/* The buckets of ir_buckets: one buffer each (the last one float longer, for
   the replicas' stop votes), the gradients as views into it, and for each
   bucket the node after which it is complete: its last gradient computed and
   every reader of the replica's own values done (bn_grad_x reads the
   bn_grad_params it shares a bucket slot with), since the sum is in place. */
/* --shard-update: which updates are sharded, each bucket's last, the state they hold in slices. */
static void shard_prepare(Lower *L)
{
    const Graph *g = L->g;
    Program *p = L->p;
    Arena *a = p->arena;
    L->shard_bucket = arena_alloc(a, sizeof(int) * (size_t)(g->n + 1));
    L->shard_state = arena_alloc(a, sizeof(bool) * (size_t)(g->n + 1));
    L->shard_last = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    L->gather_coll = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    L->votes_coll = -1;
    for (int k = 0; k < g->nbuckets; k++) L->shard_last[k] = L->gather_coll[k] = -1;
    int *members = arena_alloc(a, sizeof(int) * (size_t)(g->nbuckets + 1));
    for (int id = 0; id < g->n; id++) {
        const Node *n = &g->nodes[id];
        L->shard_bucket[id] = -1;
        int k = g->shard_update && (n->op == OP_SGD || n->op == OP_ADAMW) ? cg_grad_bucket(g, id) : -1;
        if (k < 0) continue;
        L->shard_bucket[id] = k;
        L->shard_last[k] = id;
        members[k]++;
        for (int j = 2; j < n->nin; j++) L->shard_state[n->in[j]] = true;
    }
    if (!g->shard_update) return;
    p->packs_shareable = true;   /* until a bucket's update could overlap a replica's reads (cg_shard_update) */
    p->npacks = g->nbuckets;
    p->packs = arena_alloc(a, sizeof(ShardPack) * (size_t)(g->nbuckets + 1));
    for (int k = 0; k < g->nbuckets; k++) {
        ShardPack *sp = &p->packs[k];
        sp->floats = g->buckets[k].floats;
        sp->chunk = (sp->floats + g->shard_update - 1) / g->shard_update;
        sp->names = arena_alloc(a, sizeof(char *) * (size_t)(members[k] + 1));
        sp->at = arena_alloc(a, sizeof(long) * (size_t)(members[k] + 1));
        sp->numel = arena_alloc(a, sizeof(long) * (size_t)(members[k] + 1));
        sp->state[0] = sp->state[1] = sp->base = -1;
    }
}

void cg_dp_prepare(Lower *L)
{
    const Graph *g = L->g;
    Program *p = L->p;
    shard_prepare(L);
    bool sharded = g->shard_update;
    int *last = calloc((size_t)g->n + 1, sizeof(int));
    for (int u = 0; u < g->n; u++) {
        const Node *n = &g->nodes[u];
        if (ir_op_kind(n->op) == KIND_VIEW || (n->op == OP_ALLREDUCE && n->attr.bucket >= 0)) continue;
        for (int k = 0; k < n->nin; k++) {
            int v = view_base(g, n->in[k]);
            if (u > last[v]) last[v] = u;
        }
    }
    for (int k = 0; k < g->nbuckets; k++) {
        const IrBucket *bk = &g->buckets[k];
        bool final = k == g->nbuckets - 1 && !sharded;   /* sharded: the votes are summed on their own */
        char *what = arena_printf(p->arena, "bucket %d:", k);
        long floats = sharded ? p->packs[k].chunk * g->shard_update : bk->floats + 2 * final;   /* sharded: R equal chunks */
        int b = cg_new_buf(L, BUF_ACT, dimc(floats), arena_printf(p->arena, "bucket %d", k), -1);
        p->bufs[b].pinned = true;
        L->ready[k] = 0;
        for (int j = 0; j < bk->count; j++) {
            int ar = g->bucket_nodes[bk->first + j], st = g->nodes[ar].in[0];
            L->in_bucket[st] = b;
            L->bucket_at[st] = g->nodes[ar].attr.offset;
            int r = last[st] > st ? last[st] : st;
            if (r > L->ready[k]) L->ready[k] = r;
            what = arena_printf(p->arena, "%s %s", what, g->nodes[ar].name);
        }
        L->bucket_coll[k] = new_coll(L, b, b, floats, what);
        if (sharded) p->colls[L->bucket_coll[k]].kind = COLL_REDUCE_SCATTER;
        L->bucket_buf[k] = b;
        if (final) {
            p->control = cg_new_buf(L, BUF_VIEW, dimc(2), "stop votes", -1);
            p->bufs[p->control].alias = b;
            p->bufs[p->control].offset = (int)bk->floats;
        }
    }
    free(last);
    if (sharded && g->nbuckets > 0) {
        p->control = cg_new_buf(L, BUF_ACT, dimc(2), "stop votes", -1);
        p->bufs[p->control].pinned = true;
        L->votes_coll = new_coll(L, p->control, p->control, 2, "stop votes");
    }
    if (g->accumulate > 1 && g->nbuckets > 0)
        p->accumulate = cg_new_buf(L, BUF_INPUT, dimc(1), "accumulation mode (0 one batch, 1 first, 2 middle, 3 last micro-batch)", -1);
}

/* --accumulate: bucket k's gradients summed over the step's micro-batches (see the top). */
static void accumulate_bucket(Lower *L, int k, int node)
{
    const IrBucket *bk = &L->g->buckets[k];
    Program *p = L->p;
    int acc = cg_new_buf(L, BUF_KEEP, dimc(bk->floats), arena_printf(p->arena, "bucket %d, summed over micro-batches", k), -1);
    int b[3] = { L->bucket_buf[k], acc, p->accumulate };
    const char *names[3] = { "=grads", "=acc", "mode" };
    cg_kernel(L, node, "accumulate", dimc(bk->floats), 3, b, names);
    cg_text(L, "    /* --accumulate: bucket $k's gradients over the micro-batches of one step. mode 1 (the first): acc = grads;\n"
               "       2: acc += grads; 3 (the last): grads += acc, summed across replicas after; 0 (one batch a step): nothing */\n"
               "    const float m = mode[0];\n"
               "    FOR_EACH(i, ${n}L) {\n"
               "        if (m == 1.0f) acc[i] = grads[i];\n"
               "        else if (m == 2.0f) acc[i] += grads[i];\n"
               "        else if (m == 3.0f) grads[i] += acc[i];\n"
               "    }\n",
            cg_n("k", k), cg_n("n", bk->floats));
    cg_end_kernel(L);
}

/* Before a node's steps: wait for the buckets whose sums it reads. */
void cg_dp_before(Lower *L, int id)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    if (ir_op_kind(n->op) == KIND_VIEW || n->op == OP_ALLREDUCE) return;
    for (int k = 0; k < n->nin; k++) {
        const Node *r = &g->nodes[view_base(g, n->in[k])];
        if (r->op == OP_ALLREDUCE && r->attr.bucket >= 0 && !L->waited[r->attr.bucket]) {
            L->waited[r->attr.bucket] = true;
            coll_step(L, STEP_WAIT, id, L->bucket_coll[r->attr.bucket]);
        }
    }
}

/* --shard-update: the floats of bucket k's buffer past its gradients (to R equal chunks) zeroed,
   every step: the buffer's memory is shared with other steps and programs */
static void zero_padding(Lower *L, int k, int node)
{
    const ShardPack *sp = &L->p->packs[k];
    long pad = sp->chunk * L->g->shard_update - sp->floats;
    if (pad <= 0) return;
    int b = L->bucket_buf[k];
    cg_kernel(L, node, "zero_padding", dimc(pad), 1, &b, (const char *const[]){ "=grads" })->touch = pad;
    cg_text(L, "    /* --shard-update: bucket $k's padding to $r equal chunks */\n"
               "    FOR_EACH(i, ${pad}L) grads[${n}L + i] = 0.0f;\n", cg_n("k", k), cg_n("r", L->g->shard_update), cg_n("pad", pad),
            cg_n("n", sp->floats));
    cg_end_kernel(L);
}

static bool step_reads_pack(const Program *p, const Step *st, int k)
{
    if (st->kind == STEP_GEMM) {
        int ab[3] = { st->a, st->b, st->c };
        for (int j = 0; j < 3; j++)
            if (ab[j] >= 0 && p->bufs[cg_base_buf(p, ab[j])].pack == k) return true;
        return false;
    }
    for (int j = 0; st->kind == STEP_KERNEL && j < st->nargs; j++)
        if (st->args[j] >= 0 && p->bufs[cg_base_buf(p, st->args[j])].pack == k) return true;
    return false;
}

/* Whether every step so far that reads bucket k's parameters (its update's kernel, about to be
   emitted, aside) comes before the start of a reduce-scatter waited for by now, waiting for the
   first one started after them if none is yet. On a replica, that wait's end means every replica
   has started the reduce-scatter, so has done those reads this step: replicas with one memory may
   then share the bucket's parameter block (Program.packs_shareable), each updating its chunk in
   place while no replica still reads the parameters. */
static bool reads_covered(Lower *L, int k, int node)
{
    const Program *p = L->p;
    int last_read = -1;
    for (int s = 0; s < p->nsteps; s++)
        if (!p->steps[s].sgd && step_reads_pack(p, &p->steps[s], k)) last_read = s;
    int first = -1;   /* the first bucket whose reduce-scatter starts after the reads */
    for (int s = last_read + 1; s < p->nsteps && first < 0; s++)
        for (int j = 0; p->steps[s].kind == STEP_ALLREDUCE && j < L->g->nbuckets; j++)
            if (L->bucket_coll[j] == p->steps[s].coll) first = j;
    for (int j = 0; first >= 0 && j < L->g->nbuckets; j++)   /* one started after the reads, waited for already */
        for (int s = last_read + 1; L->waited[j] && s < p->nsteps; s++)
            if (p->steps[s].kind == STEP_ALLREDUCE && p->steps[s].coll == L->bucket_coll[j]) return true;
    if (first < 0) return false;
    L->waited[first] = true;
    coll_step(L, STEP_WAIT, node, L->bucket_coll[first]);
    return true;
}

/* Whether a step reads a bucket's parameters after its update (a replica would read the shared
   block while another still writes its chunk; cf. reads_covered). */
static bool reads_after_updates(const Program *p)
{
    for (int k = 0; k < p->npacks; k++) {
        int update = -1;
        for (int s = 0; s < p->nsteps; s++)
            if (p->steps[s].sgd && step_reads_pack(p, &p->steps[s], k)) update = s;
        for (int s = update + 1; update >= 0 && s < p->nsteps; s++)
            if (!p->steps[s].sgd && step_reads_pack(p, &p->steps[s], k)) return true;
    }
    return false;
}

/* After a node's steps: start the buckets it completes. */
void cg_dp_after(Lower *L, int id)
{
    for (int k = 0; k < L->g->nbuckets; k++)
        if (L->ready[k] == id) {
            if (L->p->accumulate >= 0) accumulate_bucket(L, k, id);
            if (L->g->shard_update) zero_padding(L, k, id);
            coll_step(L, STEP_ALLREDUCE, id, L->bucket_coll[k]);
        }
}

/* At the end of the step: every bucket finishes within it (sharded: the parameters' all-gathers
   too), and the stop votes are summed. */
void cg_dp_finish(Lower *L)
{
    const Graph *g = L->g;
    if (L->p->packs_shareable && reads_after_updates(L->p)) L->p->packs_shareable = false;
    for (int k = 0; k < g->nbuckets; k++)
        if (!L->waited[k]) coll_step(L, STEP_WAIT, g->n - 1, L->bucket_coll[k]);
    for (int k = 0; g->shard_update && k < g->nbuckets; k++)
        if (L->gather_coll[k] >= 0) coll_step(L, STEP_WAIT, g->n - 1, L->gather_coll[k]);
    if (L->votes_coll >= 0) {
        coll_step(L, STEP_ALLREDUCE, g->n - 1, L->votes_coll);
        coll_step(L, STEP_WAIT, g->n - 1, L->votes_coll);
    }
}

/* --shard-update: the kernel that updates the replica's chunk of bucket k's parameters
   (SGD or AdamW as lower.c's, element for element), with their state's slice. */
static void shard_kernel(Lower *L, int k, int last, int base, int scalars)
{
    const Graph *g = L->g;
    Program *p = L->p;
    ShardPack *sp = &p->packs[k];
    const Node *n = &g->nodes[last];
    long N = sp->floats, most = sp->chunk;
    bool adamw = n->op == OP_ADAMW, mom = !adamw && n->nin == 3;
    sp->nstates = adamw ? 2 : mom ? 1 : 0;
    sp->suffix[0] = adamw ? "exp_avg" : "momentum_buffer", sp->suffix[1] = "exp_avg_sq";
    CgArgs a = { 0 };
    cg_arg(L, &a, base, "=params");
    cg_arg(L, &a, L->bucket_buf[k], "grads");
    for (int s = 0; s < sp->nstates; s++) {
        int b = sp->state[s] = cg_new_buf(L, BUF_PERSISTENT, dimc(most), arena_printf(p->arena, "bucket %d %s (a replica's slice)", k, sp->suffix[s]), -1);
        p->bufs[b].shape = (Shape){ .nd = 1, .d = { most } };
        p->bufs[b].init = INIT_ZEROS;
        p->bufs[b].shard_of = k;
        cg_arg(L, &a, b, "=%s", sp->suffix[s]);
    }
    cg_arg(L, &a, scalars, adamw ? "opt" : "sgd");
    /* the loop runs over the chunk's own [lo, hi) (the last replica's is shorter): no test in it, so the
       compiler shapes it as the whole update's loop, and contracts its multiply-adds alike (with a test it
       vectorised it masked, its FMAs elsewhere: results 1 ulp apart) */
    Step *s = cg_kernel_args(L, last, adamw ? "adamw_shard" : "sgd_shard", dimc(most), &a);
    s->sgd = true;
    s->touch = most;
    cg_text(L, "    /* --shard-update: $what on this replica's chunk [lo, hi) of bucket $k's $n parameters (the chunk its\n"
               "       reduce-scatter summed, of $r), params the bucket's parameters side by side as grads holds their\n"
               "       gradients, the state the chunk's slice */\n"
               "    const long lo = (long)a.replica * ${c}L, hi = lo + ${c}L < ${n}L ? lo + ${c}L : ${n}L;\n",
            cg_s("what", adamw ? "PyTorch's AdamW" : "PyTorch's SGD"), cg_n("k", k), cg_n("n", N), cg_n("r", g->shard_update),
            cg_n("c", most));
    if (adamw) {
        cg_body(L, "    const float b1 = opt[1], decay = opt[2], b2 = opt[3], eps = opt[4], step = opt[5], bc2s = opt[6];\n");
        cg_body(L, "    FOR_EACH(j, hi - lo) {\n"
                   "        const long i = lo + j;\n"
                   "        const float g = grads[i], p = params[i] * decay;\n"
                   "        const float m = exp_avg[j] = exp_avg[j] + (1.0f - b1) * (g - exp_avg[j]);\n"
                   "        const float v = exp_avg_sq[j] = exp_avg_sq[j] * b2 + (1.0f - b2) * g * g;\n"
                   "        params[i] = p - step * (m / (sqrtf(v) / bc2s + eps));\n    }\n");
    } else {
        cg_body(L, "    const float lr = sgd[0], momentum = sgd[1], wd = sgd[2];\n    (void)momentum;\n");
        cg_text(L, "    FOR_EACH(j, hi - lo) {\n"
                   "        const long i = lo + j;\n"
                   "        float gi = grads[i] + wd * params[i];\n"
                   "$mom"
                   "        params[i] -= lr * gi;\n    }\n",
                cg_s("mom", !mom ? "" : n->attr.nesterov ? "        { float v = momentum_buffer[j] = momentum * momentum_buffer[j] + gi; gi = gi + momentum * v; }   /* Nesterov */\n"
                                                        : "        gi = momentum_buffer[j] = momentum * momentum_buffer[j] + gi;\n"));
    }
    cg_end_kernel(L);
}

bool cg_shard_update(Lower *L, int id, int scalars)
{
    const Graph *g = L->g;
    Program *p = L->p;
    int k = L->shard_bucket ? L->shard_bucket[id] : -1;
    if (k < 0) return false;
    const Node *n = &g->nodes[id];
    ShardPack *sp = &p->packs[k];
    int param = buf_of(L, n->in[0]), gb = buf_of(L, n->in[1]);
    long at = 0;
    while (p->bufs[gb].kind == BUF_VIEW && gb != L->bucket_buf[k]) at += p->bufs[gb].offset, gb = p->bufs[gb].alias;
    Buf *pb = &p->bufs[param];
    pb->pack = k, pb->pack_at = at, pb->pack_floats = sp->chunk * g->shard_update;
    if (at == 0) sp->base = param;
    sp->names[sp->nmembers] = pb->name;
    sp->at[sp->nmembers] = at;
    sp->numel[sp->nmembers++] = ir_numel(&n->shape, 1);
    p->node_buf[id] = param;
    if (L->shard_last[k] != id) return true;
    int base = sp->base;
    if (base < 0) {
        diag_at(g->diag, n->loc, "internal: --shard-update: no parameter at the start of bucket %d", k);
        return true;
    }
    if (!reads_covered(L, k, id)) p->packs_shareable = false;
    shard_kernel(L, k, id, base, scalars);
    L->gather_coll[k] = new_coll(L, base, base, sp->chunk * g->shard_update, arena_printf(p->arena, "bucket %d parameters", k));
    p->colls[L->gather_coll[k]].kind = COLL_ALLGATHER;
    coll_step(L, STEP_ALLREDUCE, id, L->gather_coll[k]);
    return true;
}

void cg_lower_allreduce(Lower *L, int id)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    if (n->attr.bucket >= 0) {   /* in a bucket: in place, started by dp_after */
        L->p->node_buf[id] = buf_of(L, n->in[0]);
        return;
    }
    /* on its own (--sync-bn's sums): out of place, waited at once */
    int src = buf_of(L, n->in[0]), dst = cg_out_buf(L, id);
    const char *what = n->name ? n->name : arena_printf(L->p->arena, "%s %%%d", ir_op_name(g->nodes[n->in[0]].op), n->in[0]);
    int c = new_coll(L, src, dst, ir_numel(&n->shape, 1), what);
    coll_step(L, STEP_ALLREDUCE, id, c);
    coll_step(L, STEP_WAIT, id, c);
}
