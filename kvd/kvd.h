/* kvd — the daemon's roles: stage (issue 5), seeder (issue 7), relay (issue 8); config,
 * sessions and the control endpoint.
 *
 * Sections: [stage], [seeder], [relay].
 */
#ifndef KV_KVD_H
#define KV_KVD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ================================== stage ================================== */

/* ================================= seeder ================================== */

/* ================================== relay ================================== */

#endif
