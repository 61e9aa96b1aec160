/* plan — device profiles + model shape -> rank manifest. Pure functions: no I/O, no globals.
 * (issue 6) */
#ifndef KV_PLAN_H
#define KV_PLAN_H

#endif
