// Keep-alive HTTP/1.1 load for bench/http/pinned.sh: C connections to 127.0.0.1:PORT, one
// `GET /` in flight on each (epoll), N requests in total; responses are framed by their
// Content-Length (each must fit in 64 KiB). Prints "N requests, R req/s".
// Usage: loadmulti PORT C N   (build: gcc -O2 -o loadmulti loadmulti.c)
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *REQUEST = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
struct conn { int fd, have; char buf[65536]; };

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: loadmulti PORT C N\n"); return 2; }
  int port = atoi(argv[1]), c = atoi(argv[2]);
  long n = atol(argv[3]), sent = 0, done = 0;
  if (port <= 0 || c <= 0 || n <= 0) { fprintf(stderr, "PORT, C and N must be positive\n"); return 2; }
  int len = strlen(REQUEST), ep = epoll_create1(0);
  struct conn *cs = calloc(c, sizeof *cs);
  for (int i = 0; i < c; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    if (connect(fd, (void *)&a, sizeof a)) { perror("connect"); return 1; }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    cs[i].fd = fd;
    struct epoll_event e = {.events = EPOLLIN, .data.u32 = i};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
    if (sent < n) { send(fd, REQUEST, len, MSG_NOSIGNAL); sent++; }
  }
  double t0 = now();
  struct epoll_event ev[256];
  while (done < n) {
    int k = epoll_wait(ep, ev, 256, 5000);
    if (k <= 0) { fprintf(stderr, "no response for 5 s\n"); return 1; }
    for (int j = 0; j < k; j++) {
      struct conn *q = &cs[ev[j].data.u32];
      int got = recv(q->fd, q->buf + q->have, sizeof q->buf - q->have - 1, 0);
      if (got <= 0) { fprintf(stderr, "connection closed or failed (%d)\n", got); return 1; }
      q->have += got;
      q->buf[q->have] = 0;
      for (;;) {
        char *end = strstr(q->buf, "\r\n\r\n");
        if (!end) break;
        char *cl = strcasestr(q->buf, "content-length:");
        int need = (end + 4 - q->buf) + (cl && cl < end ? atoi(cl + 15) : 0);
        if (q->have < need) break;
        memmove(q->buf, q->buf + need, q->have - need);
        q->have -= need;
        q->buf[q->have] = 0;
        done++;
        if (sent < n) { send(q->fd, REQUEST, len, MSG_NOSIGNAL); sent++; }
      }
    }
  }
  printf("%ld requests, %.0f req/s\n", n, n / (now() - t0));
  return 0;
}
