/* supervise_int.h - what training.c reads of a K-FAC distribution handle
 * (kfac_dist.c) to run it under MonitoredTrainingSession. */
#ifndef KEEL_SUPERVISE_INT_H
#define KEEL_SUPERVISE_INT_H

#include <keel/kfac.h>
#include <keel/kfac_dist.h>

/* The K-FAC optimizer d distributes (borrowed from d's maker). */
keel_kfac *keel__kfac_dist_kfac(const keel_kfac_dist *d);
/* The settings d was made with (d's copy). */
const keel_kfac_dist_config *keel__kfac_dist_config(const keel_kfac_dist *d);

#endif /* KEEL_SUPERVISE_INT_H */
