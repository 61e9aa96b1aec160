/* test-net-handoff.c — the worker -> loop queue (net/handoff.c): items pushed from several
 * threads while the loop drains arrive each exactly once and in each thread's order; a drain
 * called on the loop thread delivers at once and the async callback then finds nothing; a
 * delivery may push again (callbacks run outside the lock); items still queued at close go to
 * the drop callback, never to deliver, before the close callback runs; every case ends with
 * the loop closing with no handle left (run under ASan/UBSan, that also says nothing leaked). */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>

#include "net/net.h"
#include "tests/lib/t.h"

#define THREADS 4
#define PER_THREAD 20000

struct item {
    struct net_handoff_link link;
    int thread;
    int seq;
};

static struct item *item_of(struct net_handoff_link *l)
{
    return (struct item *)((char *)l - offsetof(struct item, link));
}

static struct item *item_new(int thread, int seq)
{
    struct item *it = calloc(1, sizeof *it);
    it->thread = thread;
    it->seq = seq;
    return it;
}

struct run {
    uv_loop_t loop;
    struct net_handoff *q;
    int next[THREADS];        /* the seq expected next from each thread */
    int delivered, dropped, want;
    int out_of_order;
    int uncleared;            /* delivered with their link still set */
    int closed;               /* times the close callback ran */
    int drops_at_close;       /* dropped when the close callback ran */
    int repush;               /* deliver pushes this many more (thread 0's seq) */
};

static void on_deliver(struct net_handoff_link *l, void *ud)
{
    struct run *r = ud;
    struct item *it = item_of(l);
    r->uncleared += l->next != NULL;
    if (it->thread < 0 || it->thread >= THREADS || it->seq != r->next[it->thread])
        r->out_of_order++;
    else
        r->next[it->thread]++;
    r->delivered++;
    free(it);
    if (r->repush > 0) {
        r->repush--;
        net_handoff_push(r->q, &item_new(0, r->next[0])->link);   /* under no lock: no deadlock */
    }
    if (r->delivered == r->want)
        uv_stop(&r->loop);
}

static void on_drop(struct net_handoff_link *l, void *ud)
{
    struct run *r = ud;
    r->dropped++;
    free(item_of(l));
}

static void on_closed(void *ud)
{
    struct run *r = ud;
    r->closed++;
    r->drops_at_close = r->dropped;
}

static void run_start(struct run *r)
{
    memset(r, 0, sizeof *r);
    T_ASSERT(uv_loop_init(&r->loop) == 0, "loop");
    T_ASSERT(net_handoff_new(&r->q, &r->loop, on_deliver, on_drop, r) == 0, "net_handoff_new");
}

/* Close the queue, run the loop until it is closed, and check the loop is empty. */
static void run_finish(struct run *r)
{
    net_handoff_close(r->q, on_closed, r);
    T_CHECK(r->closed == 0, "the close callback waits for the loop");
    uv_run(&r->loop, UV_RUN_DEFAULT);
    T_CHECK(r->closed == 1, "the close callback ran once (%d)", r->closed);
    T_CHECK(r->drops_at_close == r->dropped, "the drops come before the close callback");
    T_CHECK(r->uncleared == 0, "%d delivered with their link set", r->uncleared);
    T_CHECK(uv_loop_close(&r->loop) == 0, "the loop closes with no handle left");
}

struct pusher {
    pthread_t t;
    struct run *r;
    int thread;
};

/* PER_THREAD items, in runs of 1 to 4 pushed at once (net_handoff_push_n) or one by one. */
static void *push_main(void *arg)
{
    struct pusher *p = arg;
    int seq = 0;
    while (seq < PER_THREAD) {
        int n = 1 + (seq / 7 + p->thread) % 4;
        if (n > PER_THREAD - seq)
            n = PER_THREAD - seq;
        if (n == 1) {
            net_handoff_push(p->r->q, &item_new(p->thread, seq++)->link);
            continue;
        }
        struct net_handoff_link *l[4];
        for (int i = 0; i < n; i++)
            l[i] = &item_new(p->thread, seq++)->link;
        net_handoff_push_n(p->r->q, l, (size_t)n);
    }
    return NULL;
}

T_CASE(threads_push_while_the_loop_drains)
{
    struct run r;
    run_start(&r);
    r.want = THREADS * PER_THREAD;
    struct pusher p[THREADS];
    for (int i = 0; i < THREADS; i++) {
        p[i] = (struct pusher){.r = &r, .thread = i};
        T_ASSERT(pthread_create(&p[i].t, NULL, push_main, &p[i]) == 0, "thread %d", i);
    }
    uv_run(&r.loop, UV_RUN_DEFAULT);   /* until the last item (uv_stop) */
    for (int i = 0; i < THREADS; i++)
        pthread_join(p[i].t, NULL);
    T_CHECK(r.delivered == r.want, "%d of %d delivered", r.delivered, r.want);
    T_CHECK(r.out_of_order == 0, "%d out of their thread's order (or twice)", r.out_of_order);
    for (int i = 0; i < THREADS; i++)
        T_CHECK(r.next[i] == PER_THREAD, "thread %d: %d of %d", i, r.next[i], PER_THREAD);
    run_finish(&r);
    T_CHECK(r.dropped == 0, "nothing left to drop (%d)", r.dropped);
    T_CHECK(r.delivered == r.want, "nothing delivered after the last (%d)", r.delivered);
}

T_CASE(drain_delivers_at_once)
{
    struct run r;
    run_start(&r);
    r.want = -1;   /* never stop the loop from on_deliver */
    for (int i = 0; i < 5; i++)
        net_handoff_push(r.q, &item_new(1, i)->link);
    net_handoff_drain(r.q);
    T_CHECK(r.delivered == 5 && r.next[1] == 5, "delivered in the call: %d", r.delivered);
    net_handoff_drain(r.q);   /* empty: nothing */
    T_CHECK(r.delivered == 5, "a second drain delivers nothing (%d)", r.delivered);
    uv_run(&r.loop, UV_RUN_NOWAIT);   /* the pending async callback finds the list empty */
    T_CHECK(r.delivered == 5 && r.out_of_order == 0, "nothing twice (%d)", r.delivered);
    run_finish(&r);
    T_CHECK(r.dropped == 0, "nothing dropped (%d)", r.dropped);
}

T_CASE(deliver_may_push_again)
{
    struct run r;
    run_start(&r);
    r.repush = 3;
    r.want = 4;
    net_handoff_push(r.q, &item_new(0, 0)->link);
    uv_run(&r.loop, UV_RUN_DEFAULT);
    T_CHECK(r.delivered == 4 && r.next[0] == 4 && r.out_of_order == 0,
            "the item and the three it pushed, in order: %d", r.delivered);
    run_finish(&r);
    T_CHECK(r.dropped == 0, "nothing dropped (%d)", r.dropped);
}

static void *push_ten(void *arg)
{
    struct run *r = arg;
    for (int i = 0; i < 10; i++)
        net_handoff_push(r->q, &item_new(2, i)->link);
    return NULL;
}

/* Items queued when the queue closes are dropped (freed by the owner's drop callback), not
 * delivered: the loop that would deliver them is going away with its owner. */
T_CASE(close_drops_what_is_pending)
{
    struct run r;
    run_start(&r);
    r.want = -1;
    pthread_t t;
    T_ASSERT(pthread_create(&t, NULL, push_ten, &r) == 0, "thread");
    pthread_join(t, NULL);   /* no loop turn: all ten still queued */
    run_finish(&r);
    T_CHECK(r.delivered == 0, "none delivered (%d)", r.delivered);
    T_CHECK(r.dropped == 10, "all ten dropped (%d)", r.dropped);
}

T_CASE(close_of_null_does_nothing)
{
    int calls = 0;
    net_handoff_close(NULL, on_closed, &calls);
    T_CHECK(calls == 0, "no close callback");
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(threads_push_while_the_loop_drains);
    T_RUN(drain_delivers_at_once);
    T_RUN(deliver_may_push_again);
    T_RUN(close_drops_what_is_pending);
    T_RUN(close_of_null_does_nothing);
    return T_DONE();
}
