// bench/http/floor.c: the floor of a keep-alive "Hello, World!" request on this machine: a bare
// epoll responder with no HTTP parsing (it answers every read with the response), no allocation
// and no measurement, so its CPU per request is the kernel's loopback TCP and epoll plus almost
// nothing. Its response is as long as `hello_http`'s. BENCHMARKS.md compares nodus with it.
//
// Build: gcc -O2 -o target/floor bench/http/floor.c
// Run:   target/floor PORT [WORKERS]   (WORKERS processes share one listener, EPOLLEXCLUSIVE)
// e.g.   bench/cluster/ab.sh floor='target/floor {port} 2' ...
// Only for benchmarks on 127.0.0.1: it trusts its client to send one request per read.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static const char RESPONSE[] = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                               "date: Fri, 27 Nov 2026 22:00:00 GMT\r\ncontent-length: 13\r\n\r\n"
                               "Hello, World!";

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: floor PORT [WORKERS]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    int workers = argc > 2 ? atoi(argv[2]) : 1;
    int one = 1;
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 1024)) {
        perror("floor: listen");
        return 1;
    }
    for (int w = 1; w < workers; w++)
        if (fork() == 0)
            break;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = listener};
    epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
    struct epoll_event events[128];
    static char buf[4096];
    for (;;) {
        int n = epoll_wait(ep, events, 128, -1);
        for (int i = 0; i < n; i++) {
            int fd = events[i].data.fd;
            if (fd == listener) {
                int c;
                while ((c = accept4(listener, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event ce = {.events = EPOLLIN | EPOLLET, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            for (;;) {
                ssize_t r = recv(fd, buf, sizeof buf, 0);
                if (r <= 0) {
                    if (r == 0 || errno != EAGAIN)
                        close(fd);
                    break;
                }
                send(fd, RESPONSE, sizeof RESPONSE - 1, MSG_NOSIGNAL);
                if (r < (ssize_t)sizeof buf)
                    break;
            }
        }
    }
}
