/*
** Compiling and running what the command line asks (run.c): main.c and use.c
** call it, and it calls neither (main.c -> use.c -> run.c, main.c -> run.c).
*/
#ifndef MGC_RUN_H
#define MGC_RUN_H
#include "cli.h"
#include "agree.h"

/* The names of --emit's stages and of the options that make mgc leave, by
   Emit and Leave: main.c parses with them, the ranks' agreement names them. */
extern const char *const drv_emit_names[EMIT_COUNT];
extern const char *const drv_leave_names[LEAVE_COUNT];

/* The pipeline (pipeline/pipeline.c) for this command line: the training
   or evaluation form, with or without the backward graph and the update,
   with the input's gradient (check mode); p NULL: the graph only. 0, or -1
   (said through d). */
int  drv_compile(const Cli *c, Arena *a, Diag *d, bool training, bool backward, bool input_grad, Graph *g, Program *p);
/* The GPUs c asks for are there (said when not): 0, or -1. */
int  drv_check_gpus(const Cli *c, World *w);
/* Checks what c asks for (preflight), compiles the net and runs the job:
   training, or the evaluation of a checkpoint (mgc predict, evaluate). The
   exit status. */
int  drv_run(Cli *c, World *w);
/* Before anything is compiled, on every rank: were the ranks started alike
   (under mpirun), can rank 0 write what it will, is the batch large enough,
   are the GPUs there? 0, or 2 said. */
int  drv_preflight(Cli *c, World *world);
/* --emit STAGE and --dump-kernels: a stage printed (by rank 0). The exit status. */
int  drv_emit(const Cli *c, World *world, Arena *arena, Diag *diag);
/* Training, evaluation or check mode: the training and evaluation programs,
   the same on every rank, run. The exit status. */
int  drv_train(Cli *c, World *world, Arena *arena, Diag *diag);

/* The ranks' start-up agreement (under mpirun): the first items of every
   rank's list (the mgc, and each option that makes a rank leave early), and
   the agreement itself, 0 or 2 said (by rank 0). */
void drv_agree_leaving(const Cli *c, Agreement *a);
int  drv_agree_start(const Cli *c, World *world, Agreement *a);
/* The rank's first local rank on its machine, or -1 where the launcher does not say. */
int  drv_local_rank(void);

#endif
