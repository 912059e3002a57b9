/* The post-6.12.107 prototype, and a call written for the old one (three arguments). */
struct pci_dev;
int pci_resize_resource(struct pci_dev *dev, int i, int size, int exclude_bars);

int nv_resize_pcie_bars(struct pci_dev *pci_dev, int requested_size)
{
    return pci_resize_resource(pci_dev, 1, requested_size);
}
