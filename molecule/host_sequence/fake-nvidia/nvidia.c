// Stand-in for the nvidia module: the real NVIDIA sources need PCI and more than a tinyconfig kernel has.
#include <linux/init.h>
#include <linux/module.h>
MODULE_LICENSE("GPL");
MODULE_VERSION("595.71.05");
static int __init stand_in_init(void) { return 0; }
static void __exit stand_in_exit(void) { }
module_init(stand_in_init);
module_exit(stand_in_exit);
