/* cli.h - shared pieces of the keel command line: the verb table, error
 * reporting with the exit-code contract, and option helpers. The CLI uses
 * only libkeel's public API. */
#ifndef KEEL_CLI_H
#define KEEL_CLI_H

#include <stdint.h>
#include <stdio.h>
#include <keel/keel.h>
#include <keel/app.h>

/* Exit codes: 0 success, 1 runtime failure, 2 usage or configuration. */
enum { CLI_OK = 0, CLI_RUNTIME = 1, CLI_USAGE = 2 };

typedef struct cli_verb {
    const char *name;
    const char *summary;       /* one line for `keel --help` */
    int (*run)(int argc, char **argv);   /* argv[0] is the verb */
} cli_verb;

/* Print "keel: <fmt>" to stderr and return code. */
int cli_error(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Report a failed libkeel call: "keel: <context>: <keel_last_error()>" and
 * the exit code for its status (2 for KEEL_EINVAL, else 1). */
int cli_fail(keel_status st, const char *context);
/* The exit code for a status. */
int cli_exit_code(keel_status st);
/* 1 if argv holds -h or --help (before any "--"). */
int cli_wants_help(int argc, char **argv);
/* Start a getopt_long() pass over a verb's argv (argv[0] is the verb):
 * resets getopt and silences its own messages; options may follow
 * operands, "--" ends options. Returns the optstring to pass: ":" (report
 * a missing argument as ':') followed by shorts. */
const char *cli_getopt_begin(const char *shorts);
/* The usage error for what getopt_long() just returned as '?' or ':':
 * "<verb>: unknown option '-x'; see 'keel <verb> --help'" or "<verb>:
 * <option> needs <what>". Returns CLI_USAGE. */
int cli_getopt_error(char **argv, int c, const char *what);
/* The same for a sub-verb ("ckpt show"): name leads the message, help is
 * what 'keel HELP --help' names; argv is what getopt_long() was given. */
int cli_getopt_error_as(const char *name, const char *help, char **argv,
                        int c, const char *what);

/* Route libkeel's log lines to stderr ("keel: " prefix for warnings and
 * errors); verbose also shows debug lines. */
void cli_install_logger(int verbose);
/* What starts every line this process prints on stdout and stderr (log
 * lines, errors, step lines): "" or, for a rank an MPI launcher started,
 * "rank R | ", so that the ranks' merged output says who said what. */
extern char cli_line_prefix[32];
/* Set cli_line_prefix from the rank an MPI launcher gives this process
 * (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK; the first set); "" without
 * one. */
void cli_prefix_mpi_rank(void);
/* 1 while a progress bar (no newline) ends stderr: the logger then clears
 * it before its line, and the bar is drawn again at the next step. */
extern int cli_bar_drawn;
/* Clear the progress bar that ends stderr, if one does. */
void cli_bar_clear(void);

/* The parts every progress bar shows, for frac done (at most 1) after
 * elapsed_secs: "[###.......]  42%" and the time left at the rate so far,
 * "ETA 0h01m05s". */
typedef struct cli_bar {
    char head[48];
    char eta[48];
} cli_bar;
void cli_bar_make(cli_bar *b, double frac, double elapsed_secs);

/* The most -s section.key=value overrides a command line takes. */
#define CLI_MAX_OVERRIDES 256
/* Add an -s value to over (*n_over of CLI_MAX_OVERRIDES used): CLI_OK, or
 * the usage error "<verb>: too many -s overrides", on stderr already. */
int cli_add_override(const char *verb, char **over, int *n_over,
                     char *value);

/* Load a config file, apply -s overrides and $OUTPUT_DIR, validate; prints
 * the error and returns its exit code, or CLI_OK with *out (caller frees). */
struct keel_config;
int cli_load_config(const char *path, int n_over, char **over,
                    struct keel_config **out);

/* The cluster this task belongs to: TF_CONFIG, else Slurm (SLURM_PROCID
 * set; cluster.num_ps, cluster.port_base), else the [cluster] lists with
 * task "TYPE:INDEX" (required then); NULL in *out for one process. Applies
 * cluster.mode/replicas keys and validates. Prints the problems and
 * returns the exit code (2), or CLI_OK. */
int cli_resolve_cluster(const struct keel_config *cfg, const char *task,
                        keel_cluster_spec **out);

/* CLOCK_MONOTONIC in nanoseconds: the progress bars' clock. */
int64_t cli_now_ns(void);
/* 1 if the config's hooks.progress asks for a progress bar: on, or auto
 * with stderr a terminal. */
int cli_wants_bar(const struct keel_config *cfg);

/* What train's and eval's command lines give: CONFIG (eval: or DIR or
 * CKPT.h5), the -s overrides, -v, and train's --task or eval's --checkpoint
 * and --json. */
typedef struct cli_common_args {
    const char *path;
    const char *ckpt;             /* --task (train), --checkpoint (eval) */
    char *over[CLI_MAX_OVERRIDES];
    int n_over, verbose, json;
} cli_common_args;

/* Parse a train or eval command line into a (initialised here);
 * allow_eval_opts: eval's options (--checkpoint, --json), else train's
 * (--task). CLI_OK or the usage error, on stderr already. */
int cli_parse_common(int argc, char **argv, int allow_eval_opts,
                     cli_common_args *a);

/* CKPT, or a directory's newest valid checkpoint, into buf (size bytes).
 * Prints the error and returns its exit code, or CLI_OK. */
int cli_resolve_ckpt(const char *arg, char *buf, size_t size);
/* The model of checkpoint ckpt_arg (cli_resolve_ckpt), with the config
 * file config for checkpoints that hold no architecture (NULL: none), in
 * *inf (caller frees with keel_inference_free). Prints the error and
 * returns its exit code, or CLI_OK. */
int cli_open_model(const char *ckpt_arg, const char *config,
                   keel_inference **inf);

/* The verbs (tools/cmd_<verb>.c). */
int cmd_config(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_ckpt(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_predict(int argc, char **argv);
int cmd_version(int argc, char **argv);

#endif
