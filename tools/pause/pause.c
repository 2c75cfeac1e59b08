/*
 * pause: the process of a Pod's sandbox container, our own equivalent of Kubernetes'
 * build/pause/linux/pause.c. It holds the Pod's namespaces open by existing, and as PID 1 of
 * a Pod that shares its PID namespace it reaps every orphan re-parented to it. It does nothing
 * else: SIGINT or SIGTERM ends it with status 0.
 *
 * The signals are blocked and taken with sigwaitinfo(), so no work runs in a signal handler.
 *
 *   pause        run
 *   pause -v     print the version and exit
 *
 * Built static (gcc -static), so the image needs no libc: tools/node/build.sh.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PAUSE_VERSION
#define PAUSE_VERSION "automanager-1"
#endif

static void say(const char *s) {
  ssize_t n = write(STDERR_FILENO, s, strlen(s));
  (void)n;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("pause.c %s\n", PAUSE_VERSION);
    return 0;
  }
  if (getpid() != 1)
    say("pause: warning: not running as PID 1, orphans are reaped only when it is\n");

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &set, NULL) != 0) {
    say("pause: sigprocmask failed\n");
    return 1;
  }

  for (;;) {
    siginfo_t info;
    int sig = sigwaitinfo(&set, &info);
    if (sig < 0) {
      if (errno == EINTR)
        continue;
      say("pause: sigwaitinfo failed\n");
      return 1;
    }
    if (sig == SIGCHLD) {
      /* One SIGCHLD can stand for several exits: reap until none is left. */
      while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
      continue;
    }
    say(sig == SIGINT ? "pause: shutting down, got SIGINT\n" : "pause: shutting down, got SIGTERM\n");
    return 0;
  }
}
