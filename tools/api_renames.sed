# api_renames.sed - the renames of keel's one API vocabulary (NEWS, 0.2.0):
# caller-filled settings are keel_<x>_config + keel_<x>_config_init, and an
# accessor is keel_<x>_<field>, keel_<x>_get_<field> only where the plain
# name is a type (HACKING.md, Naming). Old name -> new name, whole words
# only; running it again changes nothing.
#   sed -i -f tools/api_renames.sed FILE...
# Apply it to code, headers, docs and examples, not to NEWS (its history
# names the old API).

# settings structs: one suffix, _config
s/\bkeel_cluster_options_init\b/keel_cluster_config_init/g
s/\bkeel_cluster_options\b/keel_cluster_config/g
s/\bkeel_cluster_slurm_options_init\b/keel_cluster_slurm_config_init/g
s/\bkeel_cluster_slurm_options\b/keel_cluster_slurm_config/g
s/\bkeel_job_options_init\b/keel_job_config_init/g
s/\bkeel_job_options\b/keel_job_config/g
s/\bkeel_evaluator_options_init\b/keel_evaluator_config_init/g
s/\bkeel_evaluator_options\b/keel_evaluator_config/g
s/\bkeel_restore_opts_init\b/keel_restore_config_init/g
s/\bkeel_restore_opts\b/keel_restore_config/g

# members that point at those structs take their name
s/\bcluster_options\b/cluster_config/g
s/\brestore_opts\b/restore_config/g
s/\bhas_restore_opts\b/has_restore_config/g

# accessors: keel_<x>_<field>; keel_<x>_get_<field> where keel_<x>_<field>
# is a type
s/\bkeel_cluster_backend_get\b/keel_cluster_backend_session_backend/g
s/\bkeel_collective_get_backend\b/keel_collective_session_backend/g
s/\bkeel_train_get_threads\b/keel_train_threads/g
s/\bkeel_data_iter_get_state\b/keel_data_iter_state/g
s/\bkeel_train_profile_get\b/keel_train_get_profile/g
