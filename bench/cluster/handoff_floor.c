// bench/cluster/handoff_floor.c: the floor of a new connection per request (`Connection: close`)
// on this machine, in one process and handed over by a primary as nodus's `rr` does it. No HTTP
// parsing (every first read is answered), no allocation, no measurement, no bookkeeping: its CPU
// per connection is the kernel's (accept, SCM_RIGHTS, loopback TCP, epoll, the processes' sleeps
// and wake-ups) plus almost nothing, so the difference between its two modes is what handing a
// connection to another process costs the kernel here. BENCHMARKS.md compares nodus's rr row with it.
//
// Build: gcc -O2 -o target/handoff_floor bench/cluster/handoff_floor.c
// Run:   target/handoff_floor PORT one   one process accepts and serves
//        target/handoff_floor PORT rr    a primary accepts (up to 64 a wake-up) and hands each
//                                        batch round-robin to 2 workers, one sendmsg per worker
//                                        with the fds as SCM_RIGHTS, then closes its copies
// e.g.   bench/cluster/ab.sh -c one='target/handoff_floor {port} one' rr='target/handoff_floor {port} rr'
// Both modes answer like `hello_http` (same length, `connection: close`), then shut the write
// side down and close, as nodus-http does. Only for benchmarks on 127.0.0.1.
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#define WORKERS 2
#define BATCH 64

static const char RESPONSE[] = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n"
                               "content-length: 13\r\ndate: Sat, 28 Nov 2026 05:00:00 GMT\r\n\r\n"
                               "Hello, World!";
static char buf[4096];
static int one = 1;

// Reads the request if it is there: answers and closes (1), or leaves the socket to epoll (0).
static int serve(int fd) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EAGAIN)
        return 0;
    if (n > 0)
        send(fd, RESPONSE, sizeof RESPONSE - 1, MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    close(fd);
    return 1;
}

// A new connection in a serving process: answered at once if its request came with it.
static void take(int ep, int fd) {
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!serve(fd)) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

// Accepts up to BATCH connections into `fds`; returns how many.
static int accept_batch(int listener, int *fds) {
    int n = 0;
    while (n < BATCH && (fds[n] = accept4(listener, NULL, NULL, SOCK_NONBLOCK)) >= 0)
        n++;
    return n;
}

// Sends `n` fds over `channel` as one message (one byte of data).
static void hand(int channel, const int *fds, int n) {
    char cbuf[CMSG_SPACE(sizeof(int) * BATCH)];
    char byte = (char)n;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * n)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
    if (sendmsg(channel, &msg, MSG_NOSIGNAL) < 0)
        perror("handoff_floor: sendmsg");
}

// Takes every batch waiting on `channel` (edge-triggered: until EAGAIN).
static void receive(int ep, int channel) {
    for (;;) {
        char cbuf[CMSG_SPACE(sizeof(int) * BATCH)];
        char data[BATCH];
        struct iovec iov = {.iov_base = data, .iov_len = sizeof data};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                             .msg_controllen = sizeof cbuf};
        ssize_t got = recvmsg(channel, &msg, MSG_CMSG_CLOEXEC);
        if (got <= 0) {
            if (got == 0)
                exit(0); // the primary is gone
            return;
        }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            int fds[BATCH];
            memcpy(fds, CMSG_DATA(c), sizeof(int) * n);
            for (int i = 0; i < n; i++)
                take(ep, fds[i]);
        }
    }
}

// A serving process: `listener` (one mode) or `channel` (a worker), and its connections.
static void run(int listener, int channel) {
    int ep = epoll_create1(0);
    int source = listener >= 0 ? listener : channel;
    struct epoll_event ev = {.events = EPOLLIN | (listener >= 0 ? 0 : EPOLLET), .data.fd = source};
    epoll_ctl(ep, EPOLL_CTL_ADD, source, &ev);
    struct epoll_event events[128];
    int fds[BATCH];
    for (;;) {
        int n = epoll_wait(ep, events, 128, -1);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                int got = accept_batch(listener, fds);
                for (int k = 0; k < got; k++)
                    take(ep, fds[k]);
            } else if (fd == channel) {
                receive(ep, channel);
            } else {
                serve(fd);
            }
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[2], "one") && strcmp(argv[2], "rr"))) {
        fprintf(stderr, "usage: handoff_floor PORT one|rr\n");
        return 2;
    }
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1])),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 1024)) {
        perror("handoff_floor: listen");
        return 1;
    }
    if (!strcmp(argv[2], "one")) {
        run(listener, -1);
        return 0;
    }
    int channels[WORKERS];
    for (int w = 0; w < WORKERS; w++) {
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair)) {
            perror("handoff_floor: socketpair");
            return 1;
        }
        if (fork() == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); // no orphans when the primary is killed
            close(listener);
            close(pair[0]);
            run(-1, pair[1]);
        }
        close(pair[1]);
        channels[w] = pair[0];
    }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
    struct epoll_event events[1];
    int fds[BATCH], next = 0;
    for (;;) {
        if (epoll_wait(ep, events, 1, -1) < 1)
            continue;
        int got = accept_batch(listener, fds);
        // Round-robin: connection k of the batch goes to worker (next + k) % WORKERS.
        int per[WORKERS][BATCH], count[WORKERS] = {0};
        for (int k = 0; k < got; k++) {
            int w = (next + k) % WORKERS;
            per[w][count[w]++] = fds[k];
        }
        next = (next + got) % WORKERS;
        for (int w = 0; w < WORKERS; w++)
            if (count[w])
                hand(channels[w], per[w], count[w]);
        for (int k = 0; k < got; k++)
            close(fds[k]);
    }
}
