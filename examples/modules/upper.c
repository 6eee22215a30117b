/* upper.c: the `upper` example module in C (pipe placement).
 *
 * Build:  cc -O2 -o upper upper.c
 * Use:    forward = ["./upper"], inverse = ["./upper", "--inverse"]
 *
 * Protocol: docs/external-modules.md. Every message is u32 BE length, u8 type, body; for
 * each request we write zero or more replies, then DONE. Exits 0 when stdin closes.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FRAME = 0x02, CONTROL = 0x03, OUT_FRAME = 0x81, DONE = 0x83, ERROR = 0x84 };
#define MAX_MESSAGE ((64u << 20) + 64u)

static int read_exact(void *buf, size_t n) { return fread(buf, 1, n, stdin) == n; }

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static void reply(uint8_t type, const uint8_t *a, size_t alen, const uint8_t *b, size_t blen) {
    uint8_t head[5];
    put_u32(head, (uint32_t)(1 + alen + blen));
    head[4] = type;
    fwrite(head, 1, 5, stdout);
    if (alen) fwrite(a, 1, alen, stdout);
    if (blen) fwrite(b, 1, blen, stdout);
}

int main(int argc, char **argv) {
    int inverse = argc > 1 && strcmp(argv[1], "--inverse") == 0;
    uint8_t *msg = NULL;
    for (;;) {
        uint8_t lenb[4];
        if (!read_exact(lenb, 4)) return 0; /* host closed the channel */
        uint32_t n = (uint32_t)lenb[0] << 24 | lenb[1] << 16 | lenb[2] << 8 | lenb[3];
        if (n == 0 || n > MAX_MESSAGE) { fprintf(stderr, "upper: bad length %u\n", n); return 2; }
        msg = realloc(msg, n);
        if (!msg || !read_exact(msg, n)) return 0;
        if (msg[0] == FRAME) {
            if (n < 29) { fprintf(stderr, "upper: short frame\n"); return 2; }
            uint8_t *meta = msg + 9, *payload = msg + 29; /* type, now_ns, meta (20 bytes) */
            size_t plen = n - 29;
            for (size_t i = 0; i < plen; i++)
                payload[i] = inverse ? (uint8_t)tolower(payload[i]) : (uint8_t)toupper(payload[i]);
            reply(OUT_FRAME, meta, 20, payload, plen);
        } else if (msg[0] == CONTROL) {
            static const char e[] = "no control messages";
            reply(ERROR, (const uint8_t *)e, sizeof e - 1, NULL, 0);
            fflush(stdout);
            continue;
        }
        uint8_t wake[8];
        memset(wake, 0xff, 8); /* no wake-up wanted */
        reply(DONE, wake, 8, NULL, 0);
        fflush(stdout);
    }
}
