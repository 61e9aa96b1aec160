/* net — libuv links, ring framing and handshake, HTTP server/client, TLS, WebSocket bridge.
 * Knows nothing of tensors beyond byte payloads.
 *
 * Sections: [frames + links] (issue 5), [http] (issue 7), [tls + websocket] (issue 8).
 */
#ifndef KV_NET_H
#define KV_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ============================= frames + links ============================= */

/* ================================== http ================================== */

/* =========================== tls + websocket ============================== */

#endif
