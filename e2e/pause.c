/* The pod sandbox's pause process for the real-node suite: it holds the pod's namespaces, reaps the
 * zombies of the pod (it is PID 1 of the pod's PID namespace when one is shared) and exits 0 on
 * SIGINT or SIGTERM. Built with `gcc -static` by e2e/node_images.py; no registry image is needed. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal_number) {
    (void)signal_number;
    _exit(0);
}

static void reap(int signal_number) {
    (void)signal_number;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction action = {0};
    action.sa_handler = stop;
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    action.sa_handler = reap;
    action.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &action, NULL);
    for (;;) {
        pause();
    }
}
