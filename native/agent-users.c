#define _GNU_SOURCE
#include "agent-users.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Splits a colon-separated line in place into at most `max` fields; returns how many. */
static int split(char *line, char **fields, int max) {
    int n = 0;
    for (char *p = line; n < max;) {
        fields[n++] = p;
        char *colon = strchr(p, ':');
        if (colon == NULL) break;
        *colon = '\0';
        p = colon + 1;
    }
    char *nl = n > 0 ? strchr(fields[n - 1], '\n') : NULL;
    if (nl != NULL) *nl = '\0';
    return n;
}

static int parse_id(const char *text, unsigned long *out) {
    if (*text == '\0') return -1;
    char *end = NULL;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || value > 0xfffffffeUL) return -1;
    *out = value;
    return 0;
}

/* The passwd entry whose name is `name`, or (name NULL) whose uid is `uid`. */
static int find_passwd(const char *name, uid_t uid, struct agent_user *out) {
    FILE *f = fopen("/etc/passwd", "re");
    if (f == NULL) return -1;
    char line[1024];
    int found = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        char *field[7];
        if (split(line, field, 7) < 7) continue;
        unsigned long u, g;
        if (parse_id(field[2], &u) != 0 || parse_id(field[3], &g) != 0) continue;
        if (name != NULL ? strcmp(field[0], name) != 0 : (uid_t)u != uid) continue;
        out->uid = (uid_t)u;
        out->gid = (gid_t)g;
        snprintf(out->name, sizeof out->name, "%s", field[0]);
        snprintf(out->home, sizeof out->home, "%s", field[5][0] ? field[5] : "/");
        found = 0;
        break;
    }
    fclose(f);
    return found;
}

/* The primary group and every /etc/group entry that lists the user as a member. */
static void find_groups(struct agent_user *u) {
    u->groups[0] = u->gid;
    u->ngroups = 1;
    FILE *f = fopen("/etc/group", "re");
    if (f == NULL) return;
    char line[4096];
    while (fgets(line, sizeof line, f) != NULL && u->ngroups < AGENT_MAX_GROUPS) {
        char *field[4];
        if (split(line, field, 4) < 4) continue;
        unsigned long g;
        if (parse_id(field[2], &g) != 0 || (gid_t)g == u->gid) continue;
        for (char *member = strtok(field[3], ","); member != NULL; member = strtok(NULL, ",")) {
            if (strcmp(member, u->name) == 0) {
                u->groups[u->ngroups++] = (gid_t)g;
                break;
            }
        }
    }
    fclose(f);
}

int agent_user_lookup(const char *spec, struct agent_user *out, const char **why) {
    memset(out, 0, sizeof *out);
    char text[128];
    snprintf(text, sizeof text, "%s", spec);
    char *colon = strchr(text, ':');
    if (colon != NULL) *colon = '\0';
    unsigned long uid, gid;
    if (parse_id(text, &uid) == 0) {
        /* A numeric user: its passwd entry if it has one (name, home, groups), else bare ids. */
        if (find_passwd(NULL, (uid_t)uid, out) != 0) {
            out->uid = (uid_t)uid;
            out->gid = (gid_t)uid;
            snprintf(out->name, sizeof out->name, "%lu", uid);
            snprintf(out->home, sizeof out->home, "/");
        }
    } else if (find_passwd(text, 0, out) != 0) {
        *why = "no such user in the sandbox's /etc/passwd";
        return ENOENT;
    }
    if (colon != NULL) {
        if (parse_id(colon + 1, &gid) != 0) {
            *why = "the group of uid:gid is not a number";
            return EINVAL;
        }
        out->gid = (gid_t)gid;
    }
    find_groups(out);
    return 0;
}

int agent_user_become(const struct agent_user *u) {
    if (syscall(SYS_setgroups, u->ngroups, u->groups) != 0) return errno;
    if (syscall(SYS_setresgid, u->gid, u->gid, u->gid) != 0) return errno;
    if (syscall(SYS_setresuid, u->uid, u->uid, u->uid) != 0) return errno;
    return 0;
}
