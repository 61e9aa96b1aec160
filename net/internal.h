/* net/internal.h — cross-file internals of the net module (the TLS + WebSocket part has its
 * own, ws_internal.h). Not a public interface. */
#ifndef KV_NET_INTERNAL_H
#define KV_NET_INTERNAL_H

#include <stddef.h>

#include <uv.h>

/* The connected peer of tcp as "ip:port" into out[n]: 0, or a negative libuv error (out
 * untouched). */
int net__tcp_peer(const uv_tcp_t *tcp, char *out, size_t n);

/* A listen address "host:port" or "[v6]:port" (numeric host; empty = 0.0.0.0; port 0..65535)
 * into *ss: 0, or -EINVAL with *why saying what is wrong with it. */
int net__listen_addr(const char *addr, struct sockaddr_storage *ss, const char **why);

/* Makes tcp (initialised, not yet bound) a socket at *ss for listening: the listening socket
 * this process was handed at exactly that address (LISTEN_FDS, net/listen.c), else a fresh
 * bind. 0 or a negative libuv error. */
int net__listen_tcp(uv_tcp_t *tcp, const struct sockaddr_storage *ss);

#endif
