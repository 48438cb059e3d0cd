/*
 * corectl_job_env: the site's settings in the environment of every Slurm job (bare and in
 * containers), installed by corectl's pyxis role and built with pyxis against the node's Slurm.
 *
 * Reads every "*.env" file of a directory (dir=PATH on the plugstack line, default
 * /etc/slurm/job-env.d) and sets each NAME=value line in the job's environment before its tasks
 * start: the site's defaults (the fabric's NCCL settings, written by the rdma role). A variable
 * the user already has in the job's environment wins; of two files naming one variable, the one
 * later in name order wins. Lines that are empty or start with '#' are skipped.
 *
 * Why a SPANK plugin and not Slurm's TaskProlog: with pyxis, the TaskProlog runs inside the
 * job's container, and since Slurm 24.11 through slurmstepd itself, so a TaskProlog makes every
 * image without slurmstepd's libraries fail (NVIDIA/pyxis issues 83 and 163). A plugin's
 * user_init runs in slurmstepd on the host, before pyxis enters the container.
 *
 * It never fails a job: a missing directory sets nothing; a bad line is skipped and named in
 * slurmd's log (slurm_info: slurm_error would also print it into every job's error output).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(corectl_job_env, 1);

#define DEFAULT_DIR "/etc/slurm/job-env.d"
#define PREFIX "corectl_job_env"

static int is_env_file(const struct dirent *entry)
{
	size_t length = strlen(entry->d_name);

	return entry->d_name[0] != '.' && length > 4 && strcmp(entry->d_name + length - 4, ".env") == 0;
}

static int is_name(const char *text)
{
	const char *c = text;

	if (!(*c == '_' || (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z')))
		return 0;
	for (c++; *c; c++)
		if (!(*c == '_' || (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9')))
			return 0;
	return 1;
}

static void apply_file(spank_t sp, const char *path)
{
	char line[8192];
	int number = 0;
	FILE *file = fopen(path, "r");

	if (file == NULL) {
		slurm_error(PREFIX ": %s: %s", path, strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), file) != NULL) {
		char *equals;
		spank_err_t rc;

		number++;
		line[strcspn(line, "\r\n")] = '\0';
		if (line[0] == '\0' || line[0] == '#')
			continue;
		equals = strchr(line, '=');
		if (equals == NULL) {
			slurm_info(PREFIX ": %s:%d: not NAME=value, skipped", path, number);
			continue;
		}
		*equals = '\0';
		if (!is_name(line)) {
			slurm_info(PREFIX ": %s:%d: '%s' is not a variable name, skipped", path, number, line);
			continue;
		}
		rc = spank_setenv(sp, line, equals + 1, 0);
		if (rc != ESPANK_SUCCESS && rc != ESPANK_ENV_EXISTS)
			slurm_error(PREFIX ": %s:%d: cannot set %s: %s", path, number, line, spank_strerror(rc));
	}
	fclose(file);
}

/* In slurmstepd on the node, for every step (the batch script's too), before the tasks start. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	const char *dir = DEFAULT_DIR;
	struct dirent **entries;
	char path[4096];
	int count;
	int i;

	for (i = 0; i < ac; i++)
		if (strncmp(av[i], "dir=", 4) == 0)
			dir = av[i] + 4;
	count = scandir(dir, &entries, is_env_file, alphasort);
	if (count < 0) {
		if (errno != ENOENT)
			slurm_error(PREFIX ": %s: %s", dir, strerror(errno));
		return ESPANK_SUCCESS;
	}
	/* last name first: a variable is set once (never overwritten), so the later file wins */
	for (i = count - 1; i >= 0; i--) {
		if (snprintf(path, sizeof(path), "%s/%s", dir, entries[i]->d_name) < (int)sizeof(path))
			apply_file(sp, path);
		free(entries[i]);
	}
	free(entries);
	return ESPANK_SUCCESS;
}
