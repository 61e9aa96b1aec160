/* util/err.h — the one size of an error-message buffer (the `char *err, size_t errlen` pair
 * that fallible calls fill). 1024 bytes hold a message that names two paths or a URL and the
 * value that was wrong; longer ones are cut, never overrun. */
#ifndef KV_UTIL_ERR_H
#define KV_UTIL_ERR_H

#define KV_ERR_MAX 1024

#endif
