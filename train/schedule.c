/*
** The learning rate's schedule: as PyTorch's schedulers stepped once an
** epoch or once a step (--lr-schedule, --lr-per, --warmup), and the recipe
** in words that checkpoints keep.
*/
#include "schedule.h"
#include <math.h>
#include <string.h>

float train_lr(const TrainConfig *cfg, int epoch, long step, long steps_per_epoch)
{
    double lr = cfg->lr;
    long t = (long)(epoch - 1) * steps_per_epoch + step;   /* the steps of the run before this one */
    /* the schedule's clock: epochs or steps gone, and how many the run has */
    double u = cfg->lr_per_step ? (double)t : (double)(epoch - 1);
    double total = cfg->lr_per_step ? (double)cfg->epochs * (double)steps_per_epoch : (double)cfg->epochs;
    if (cfg->lr_schedule == LR_COSINE && total > 0) lr *= 0.5 * (1.0 + cos(M_PI * u / total));
    for (int k = 0; cfg->lr_schedule == LR_STEP && k < cfg->lr_nmilestones; k++)
        if (cfg->lr_milestones[k] <= u) lr *= cfg->lr_gamma;
    if (t < cfg->warmup) lr *= (double)(t + 1) / (double)cfg->warmup;
    return (float)lr;
}

bool train_lr_per_step(const TrainConfig *cfg)
{
    return cfg->warmup > 0 || (cfg->lr_per_step && cfg->lr_schedule != LR_CONSTANT);
}


/* The learning-rate recipe in words (a checkpoint's "lr_schedule"): what --resume compares. */
void train_optimizer_str(const TrainConfig *cfg, char *out, size_t size)
{
    if (cfg->optimizer == IR_ADAMW)
        snprintf(out, size, "adamw betas %g,%g eps %g weight decay %g", (double)cfg->beta1, (double)cfg->beta2, (double)cfg->eps,
                 (double)cfg->weight_decay);
    else
        snprintf(out, size, "sgd momentum %g%s weight decay %g", (double)cfg->momentum, cfg->nesterov ? " nesterov" : "",
                 (double)cfg->weight_decay);
}

void train_schedule_str(const TrainConfig *cfg, char *out, size_t size)
{
    int p = snprintf(out, size, "lr %g", (double)cfg->lr);
    if (cfg->lr_schedule == LR_COSINE)
        p += snprintf(out + p, size - (size_t)p, ", cosine over %d epoch%s, every %s", cfg->epochs, cfg->epochs == 1 ? "" : "s",
                      cfg->lr_per_step ? "step" : "epoch");
    else if (cfg->lr_schedule == LR_STEP) {
        p += snprintf(out + p, size - (size_t)p, ", times %g after %s", (double)cfg->lr_gamma, cfg->lr_per_step ? "steps" : "epochs");
        for (int k = 0; k < cfg->lr_nmilestones && p < (int)size; k++)
            p += snprintf(out + p, size - (size_t)p, "%s%d", k ? "," : " ", cfg->lr_milestones[k]);
    } else {
        p += snprintf(out + p, size - (size_t)p, ", constant");
    }
    if (cfg->warmup && p < (int)size) snprintf(out + p, size - (size_t)p, ", warmup %d steps", cfg->warmup);
}
