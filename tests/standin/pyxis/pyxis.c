/*
 * corectl test stand-in for the pyxis SPANK plugin.
 *
 * It registers the container options that pyxis adds to srun/salloc/sbatch, remembers their values and, in the
 * remote (slurmstepd) context, exports them to the job environment so that a test job can show what it was given:
 *   PYXIS_STANDIN_IMAGE, PYXIS_STANDIN_NAME, PYXIS_STANDIN_MOUNTS, PYXIS_STANDIN_WORKDIR.
 * No container is ever started.
 */

#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(pyxis, 1);

enum {
	OPT_IMAGE = 1,
	OPT_NAME,
	OPT_MOUNTS,
	OPT_WORKDIR,
};

static char *opt_values[OPT_WORKDIR + 1];

static const char *const opt_env[OPT_WORKDIR + 1] = {
	[OPT_IMAGE] = "PYXIS_STANDIN_IMAGE",
	[OPT_NAME] = "PYXIS_STANDIN_NAME",
	[OPT_MOUNTS] = "PYXIS_STANDIN_MOUNTS",
	[OPT_WORKDIR] = "PYXIS_STANDIN_WORKDIR",
};

static int remember_option(int val, const char *optarg, int remote);

static struct spank_option pyxis_options[] = {
	{
		"container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
		"[pyxis] the image to use for the container filesystem (stand-in: recorded only)",
		1, OPT_IMAGE, remember_option,
	},
	{
		"container-name", "NAME",
		"[pyxis] name to use for saving and loading the container on the host (stand-in: recorded only)",
		1, OPT_NAME, remember_option,
	},
	{
		"container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]",
		"[pyxis] bind mount[s] inside the container (stand-in: recorded only)",
		1, OPT_MOUNTS, remember_option,
	},
	{
		"container-workdir", "PATH",
		"[pyxis] working directory inside the container (stand-in: recorded only)",
		1, OPT_WORKDIR, remember_option,
	},
	SPANK_OPTIONS_TABLE_END
};

static int remember_option(int val, const char *optarg, int remote)
{
	char *copy;

	(void)remote;
	if (val < OPT_IMAGE || val > OPT_WORKDIR)
		return -1;
	if (optarg == NULL || *optarg == '\0') {
		slurm_error("pyxis: --%s needs a value", pyxis_options[val - 1].name);
		return -1;
	}
	copy = strdup(optarg);
	if (copy == NULL)
		return -1;
	free(opt_values[val]);
	opt_values[val] = copy;
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	struct spank_option *opt;
	int i;

	for (i = 0; i < ac; i++)
		slurm_verbose("pyxis: ignoring plugstack argument \"%s\" (stand-in)", av[i]);

	if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE && ctx != S_CTX_ALLOCATOR)
		return 0;

	for (opt = pyxis_options; opt->name != NULL; opt++) {
		if (spank_option_register(sp, opt) != ESPANK_SUCCESS) {
			slurm_error("pyxis: could not register option --%s", opt->name);
			return -1;
		}
	}
	return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	spank_err_t rc;
	int val;

	(void)ac;
	(void)av;
	if (!spank_remote(sp) || opt_values[OPT_IMAGE] == NULL)
		return 0;

	for (val = OPT_IMAGE; val <= OPT_WORKDIR; val++) {
		if (opt_values[val] == NULL)
			continue;
		rc = spank_setenv(sp, opt_env[val], opt_values[val], 1);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("pyxis: could not set %s: %s", opt_env[val], spank_strerror(rc));
			return -1;
		}
	}
	slurm_info("pyxis: stand-in would start container image %s", opt_values[OPT_IMAGE]);
	return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	int val;

	(void)sp;
	(void)ac;
	(void)av;
	for (val = OPT_IMAGE; val <= OPT_WORKDIR; val++) {
		free(opt_values[val]);
		opt_values[val] = NULL;
	}
	return 0;
}
