/*
** mgc plot: runs' --log files as curves in an SVG (plot.c).
*/
#ifndef MGC_PLOT_H
#define MGC_PLOT_H

/* argv[0] is "plot": 0, 1 (a file could not be read or written) or 2 (the command line), said */
int plot_main(int argc, char **argv);

#endif
