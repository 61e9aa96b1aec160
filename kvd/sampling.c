/* sampling.c — a session's sampling parameters as the ring's OPEN carries them, in the form
 * the model's sampler takes: one conversion for the last rank that samples (kvd/stage) and the
 * market that judges its tokens (kvd/market/audit.c). */
#include "kvd/kvd.h"
#include "model/model.h"
#include "ring/ring.h"

void kvd_sampler_params(struct model_sampler_params *sp, const struct ring_open_params *p)
{
    model_sampler_params_default(sp);
    sp->seed = p->seed;
    sp->temperature = p->temperature;
    sp->top_k = p->top_k;
    sp->top_p = p->top_p;
    sp->min_p = p->min_p;
    sp->repeat_penalty = p->repeat_penalty;
    sp->freq_penalty = p->freq_penalty;
    sp->presence_penalty = p->presence_penalty;
    sp->penalty_last_n = p->penalty_last_n;
}
