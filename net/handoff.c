/* handoff.c — the way from a worker thread back to a libuv loop: pushers append items to a
 * list under a mutex and wake the loop with uv_async_send; the loop takes the whole list under
 * the mutex and hands each item to its owner outside it, so an owner's callback may push, take
 * its own locks or free the item without holding up the workers. The queue lives behind the
 * async handle and is freed only in that handle's close callback. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "net/net.h"

struct net_handoff {
    uv_async_t async;
    pthread_mutex_t mu;
    struct net_handoff_link *head, *tail;   /* under mu */
    net_handoff_cb deliver, drop;
    void *ud;
    net_handoff_closed_cb closed;           /* net_handoff_close's: after the queue is freed */
    void *closed_ud;
};

/* With q->mu held: the list, emptied. */
static struct net_handoff_link *take_all(struct net_handoff *q)
{
    struct net_handoff_link *l = q->head;
    q->head = q->tail = NULL;
    return l;
}

/* Each item of l to fn, in list order; an item's link is cleared first, so fn may reuse it. */
static void each(struct net_handoff_link *l, net_handoff_cb fn, void *ud)
{
    while (l) {
        struct net_handoff_link *next = l->next;
        l->next = NULL;
        fn(l, ud);
        l = next;
    }
}

static void on_async(uv_async_t *a)
{
    net_handoff_drain(a->data);
}

int net_handoff_new(struct net_handoff **out, uv_loop_t *loop, net_handoff_cb deliver,
                    net_handoff_cb drop, void *ud)
{
    struct net_handoff *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    if (pthread_mutex_init(&q->mu, NULL) != 0) {
        free(q);
        return -ENOMEM;
    }
    /* The handle last: a failure before it has nothing to close, so nothing waits for a turn
     * of the loop. */
    int rc = uv_async_init(loop, &q->async, on_async);
    if (rc < 0) {
        pthread_mutex_destroy(&q->mu);
        free(q);
        return rc;
    }
    q->async.data = q;
    q->deliver = deliver;
    q->drop = drop;
    q->ud = ud;
    *out = q;
    return 0;
}

void net_handoff_push_n(struct net_handoff *q, struct net_handoff_link **items, size_t n)
{
    if (n == 0)
        return;
    pthread_mutex_lock(&q->mu);
    for (size_t i = 0; i < n; i++) {
        items[i]->next = NULL;
        if (q->tail)
            q->tail->next = items[i];
        else
            q->head = items[i];
        q->tail = items[i];
    }
    pthread_mutex_unlock(&q->mu);
    /* Outside the lock: the loop thread may already be draining. Sends before the loop runs
     * its callback coalesce into one call, which finds every item pushed so far. */
    uv_async_send(&q->async);
}

void net_handoff_push(struct net_handoff *q, struct net_handoff_link *item)
{
    net_handoff_push_n(q, &item, 1);
}

void net_handoff_drain(struct net_handoff *q)
{
    pthread_mutex_lock(&q->mu);
    struct net_handoff_link *l = take_all(q);
    pthread_mutex_unlock(&q->mu);
    each(l, q->deliver, q->ud);
}

static void on_closed(uv_handle_t *h)
{
    struct net_handoff *q = h->data;
    /* No thread pushes any more (net_handoff_close's contract); the lock is taken all the
     * same, so the list is only ever touched under it. */
    pthread_mutex_lock(&q->mu);
    struct net_handoff_link *l = take_all(q);
    pthread_mutex_unlock(&q->mu);
    if (q->drop)
        each(l, q->drop, q->ud);
    net_handoff_closed_cb closed = q->closed;
    void *ud = q->closed_ud;
    pthread_mutex_destroy(&q->mu);
    free(q);
    if (closed)
        closed(ud);
}

void net_handoff_close(struct net_handoff *q, net_handoff_closed_cb closed, void *ud)
{
    if (!q)
        return;
    q->closed = closed;
    q->closed_ud = ud;
    uv_close((uv_handle_t *)&q->async, on_closed);
}
